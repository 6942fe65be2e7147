"""Any JSON value in any field of a server's answer: nothing raises, each request is recorded once, and the
request (and so the point) is valid exactly when the value is one a server could send.

Two properties: the parser alone over many arbitrary chunks (several fields at once, and whole payloads of any
JSON type), and the whole client over loopback against the instrument, one field per example, where a small
oracle below says, field by field, which values are possible answers to the instrument's request.
"""

from __future__ import annotations

import asyncio
import itertools
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.harness.client import EndpointConfig
from kvbench.harness.instrument import InstrumentBehaviour, overridden
from kvbench.harness.loadgen import LoadGenerator
from kvbench.harness.runner import invalid_reasons
from kvbench.harness.stream_answer import (
    API_CHAT,
    API_COMPLETIONS,
    AnswerLimits,
    AnswerReader,
    Chunk,
    Failure,
    parse_payload,
)
from kvbench.measure.records import RecordWriter, RequestRecord, read_records
from kvbench.measure.schedule import LoadSpec

from .instrument_fixture import serving
from .test_loadgen import workload

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
MAX_TOKENS = 4  # one token per chunk, each chunk with its one token id
PROMPT = 64 + 8  # the workload's context and user tokens: the instrument's prompt_tokens
CACHED = 8
SESSIONS = 2
MAX_ID = (1 << 31) - 1


def is_count(value, low, high) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def first_list_or_none(logprobs: dict) -> bool:
    for key in ("tokens", "content"):
        if logprobs.get(key) is not None:
            return isinstance(logprobs[key], list)
    return True


# Path -> (the values drawn: any JSON or a plausible one, whether a value is a possible answer). The
# instrument's answer: PROMPT prompt tokens with CACHED cached, MAX_TOKENS tokens with their ids, usage last.
FIELDS = {
    "usage.prompt_tokens": (st.integers(0, 200), lambda v: v is None or is_count(v, CACHED, 1 << 24)),
    "usage.completion_tokens": (st.integers(0, 8), lambda v: v is None or is_count(v, MAX_TOKENS - 1, MAX_TOKENS)),
    "usage.total_tokens": (st.integers(), lambda v: True),  # not read
    "usage.prompt_tokens_details.cached_tokens": (st.integers(0, 100), lambda v: v is None or is_count(v, 0, PROMPT)),
    "usage.prompt_tokens_details": (
        st.just({}),
        lambda v: (
            v is None
            or (
                isinstance(v, dict)
                and (v.get("cached_tokens") is None or is_count(v["cached_tokens"], 0, PROMPT))
                and v.get("cached_tokens_by_tier") is None
            )
        ),
    ),
    "usage": (
        st.just({}),
        lambda v: (
            v is None
            or (
                isinstance(v, dict)
                and all(v.get(key) is None for key in ("prompt_tokens", "completion_tokens", "prompt_tokens_details"))
            )
        ),
    ),
    "choices": (st.just([]), lambda v: False),  # a list of possible choices is out of reach of JSON drawn at random
    "choices.0.text": (st.text(max_size=8), lambda v: v is None or isinstance(v, str)),
    "choices.0.token_ids": (
        st.lists(st.integers(0, MAX_ID), max_size=2),
        lambda v: v is None or (isinstance(v, list) and len(v) <= 1 and all(is_count(x, 0, MAX_ID) for x in v)),
    ),
    "choices.0.token_ids.0": (st.integers(-5, MAX_ID + 5), lambda v: is_count(v, 0, MAX_ID)),
    "choices.0.finish_reason": (st.text(max_size=70), lambda v: v is None or (isinstance(v, str) and len(v) <= 64)),
    "choices.0.logprobs": (
        st.fixed_dictionaries({"tokens": st.lists(st.text(max_size=3), max_size=2)}),
        lambda v: v is None or (isinstance(v, dict) and first_list_or_none(v)),
    ),
    "choices.0.index": (st.integers(), lambda v: True),  # not read
    "error": (JSON, lambda v: True),  # beside non-empty choices an error object is not a failed request
}


def possible(path: str, value) -> bool:
    return FIELDS[path][1](value)


@st.composite
def one_field(draw):
    path = draw(st.sampled_from(sorted(FIELDS)))
    return path, draw(JSON | FIELDS[path][0])


def test_any_json_in_any_field_through_the_client(tmp_path):
    current: dict = {}
    loop = asyncio.new_event_loop()
    server = serving(
        lambda index, body: InstrumentBehaviour(
            first_token_ms=1, chunk_interval_ms=0.5, cached_tokens=CACHED, overrides=current["overrides"]
        )
    )
    url, _ = loop.run_until_complete(server.__aenter__())
    files = itertools.count()

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(case=one_field())
    def check(case):
        path, value = case
        current["overrides"] = {path: value}
        generator = LoadGenerator(EndpointConfig(base_url=url, model="m"), LoadSpec(concurrency=2), run_id="p")
        records_file = tmp_path / f"{next(files)}.jsonl"
        with RecordWriter(records_file) as writer:
            result = loop.run_until_complete(generator.run(workload(sessions=SESSIONS, max_tokens=MAX_TOKENS), writer))
        on_disk = list(read_records(records_file))
        assert sorted(rec.session_id for rec in on_disk) == [f"s{i}" for i in range(SESSIONS)]
        expected = possible(path, value)
        for rec in result.records:
            assert rec.ok == expected, (path, value, rec.error)
            assert rec.ok or rec.error.startswith("bad_answer: "), rec.error
        assert (invalid_reasons(result.records, 0.5, None, None) == []) == expected

    try:
        check()
    finally:
        loop.run_until_complete(server.__aexit__(None, None, None))
        loop.close()


def field_name(path: str) -> str:
    """A dotted override path as the parser names the field: `choices.0.text` is `choices[0].text`."""
    return path.replace(".0", "[0]")


CHUNK_PATHS = [
    "choices",
    "choices.0",
    "choices.0.text",
    "choices.0.delta",
    "choices.0.delta.content",
    "choices.0.token_ids",
    "choices.0.token_ids.0",
    "choices.0.finish_reason",
    "choices.0.logprobs",
    "choices.0.logprobs.tokens",
    "usage",
    "usage.prompt_tokens",
    "usage.completion_tokens",
    "usage.prompt_tokens_details",
    "usage.prompt_tokens_details.cached_tokens",
    "usage.prompt_tokens_details.cached_tokens_by_tier",
    "error",
]


@settings(max_examples=200, deadline=None)
@given(
    api=st.sampled_from([API_COMPLETIONS, API_CHAT]),
    overrides=st.dictionaries(st.sampled_from(CHUNK_PATHS), JSON, min_size=1, max_size=4),
    anything=JSON,
)
def test_the_parser_never_raises_and_names_the_field(api, overrides, anything):
    limits = AnswerLimits(max_tokens=MAX_TOKENS)
    # A whole payload of any JSON type.
    assert isinstance(parse_payload(json.dumps(anything), api, limits), (Chunk, Failure))
    event = {
        "choices": [{"index": 0, "text": " a", "delta": {"content": " a"}, "token_ids": [7]}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}},
    }
    event = overridden(event, dict(sorted(overrides.items(), key=lambda item: len(item[0]))))
    reader = AnswerReader(api, limits)
    record = RequestRecord(run_id="r", request_id="q", session_id="s", tenant="t", turn=0, queued_ns=0)
    failure = reader.take(json.dumps(event), 1, record) or reader.finish(record)
    if (
        isinstance(failure, Failure)
        and failure.kind == "bad_answer"
        and not failure.reason.startswith(
            (
                "no content",
                "server ignored",
                "usage.completion_tokens",
                "usage.prompt_tokens_details.cached_tokens",
                "cached_tokens_by_tier",
                "usage.prompt_tokens +",
            )
        )
    ):
        assert any(failure.reason.startswith(field_name(path)) for path in overrides), failure
