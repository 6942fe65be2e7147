"""A misbehaving server, one instrument mode per misbehaviour: every answer no server could give fails its
request with a reason naming the field, each request is recorded once, the point is invalid, nothing raises."""

from __future__ import annotations

import asyncio

import pytest

from kvbench.harness.client import EndpointConfig
from kvbench.harness.instrument import InstrumentBehaviour
from kvbench.harness.loadgen import LoadGenerator
from kvbench.harness.runner import invalid_reasons
from kvbench.harness.sse import EventTooLarge, SSEParser
from kvbench.measure.metrics import summarize
from kvbench.measure.records import RecordWriter, read_records
from kvbench.measure.schedule import LoadSpec

from .instrument_fixture import serving
from .test_loadgen import workload

MAX_TOKENS = 4
SESSIONS = 3


def run(behaviour, tmp_path=None, sessions=SESSIONS, **endpoint):
    """Every session's one turn against the instrument; the result, its log and the records on disk."""
    path = tmp_path / "requests.jsonl" if tmp_path is not None else None

    async def go():
        async with serving(behaviour) as (url, log):
            generator = LoadGenerator(
                EndpointConfig(base_url=url, model="m", **endpoint), LoadSpec(concurrency=2), run_id="bad"
            )
            if path is None:
                return await generator.run(workload(sessions=sessions, max_tokens=MAX_TOKENS)), log
            with RecordWriter(path) as writer:
                return await generator.run(workload(sessions=sessions, max_tokens=MAX_TOKENS), writer), log

    result, log = asyncio.run(go())
    on_disk = list(read_records(path)) if path is not None else None
    return result, log, on_disk


def fast(**fields):
    return InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1, **fields)


# (overrides, what the error must say): the cases, then one per check.
BAD_ANSWERS = [
    ({"usage.prompt_tokens": "lots"}, "bad_answer: usage.prompt_tokens is 'lots', not an integer"),
    ({"usage": [1, 2]}, "bad_answer: usage is [1, 2], not an object"),
    ({"choices": ["oops"]}, "bad_answer: choices[0] is 'oops', not an object"),
    ({"choices.0.token_ids": ["zz"]}, "bad_answer: choices[0].token_ids[0] is 'zz', not an integer"),
    ({"usage.completion_tokens": -47}, "bad_answer: usage.completion_tokens is -47, below 0"),
    ({"usage.prompt_tokens": 1e30}, "bad_answer: usage.prompt_tokens is 1e+30, not an integer"),
    (
        {"usage.prompt_tokens": 10**30},
        "bad_answer: usage.prompt_tokens is 1000000000000000000000000000000, past the context bound",
    ),
    ({"usage.completion_tokens": 70}, "bad_answer: usage.completion_tokens is 70, past max_tokens 4"),
    ({"choices": []}, "bad_answer: no content: the stream ended without a token"),
    (
        {"usage.prompt_tokens_details.cached_tokens": 2000},
        "bad_answer: usage.prompt_tokens_details.cached_tokens 2000 > usage.prompt_tokens",
    ),
    (
        {"usage.completion_tokens": 1},
        "bad_answer: usage.completion_tokens 1 disagrees with the 4 token ids streamed (tolerance 1)",
    ),
    ({"choices.0.finish_reason": {"a": 1}}, 'bad_answer: choices[0].finish_reason is {"a": 1}, not a string'),
    ({"choices.0.text": 5}, "bad_answer: choices[0].text is 5, not a string"),
    ({"choices.0.logprobs": "x"}, "bad_answer: choices[0].logprobs is 'x', not an object"),
]


@pytest.mark.parametrize("overrides, error", BAD_ANSWERS, ids=[next(iter(case)) for case, _ in BAD_ANSWERS])
def test_an_impossible_answer_fails_its_request_once_and_the_point(tmp_path, overrides, error):
    result, log, on_disk = run(fast(overrides=overrides), tmp_path)
    assert len(log.bodies) == SESSIONS  # every session was still sent
    assert sorted(rec.session_id for rec in on_disk) == [f"s{i}" for i in range(SESSIONS)]  # each recorded once
    for rec in result.records:
        assert rec.error.startswith(error), rec.error
    summary = summarize(result.records)
    assert summary.completed == 0 and summary.output_tok_s is None and summary.cache.cache_hit_rate is None
    assert result.aborted is None  # the server answered: it is not unreachable
    breach = invalid_reasons(result.records, 1.0, None, None)[-1]
    assert breach.startswith(f"server answers failed the client's checks: {SESSIONS}/{SESSIONS} requests ({error}")


def test_a_plausible_answer_passes_every_check():
    # Usage within the tolerance of the streamed ids, cached below prompt, unknown fields ignored.
    result, _, _ = run(fast(cached_tokens=8, overrides={"usage.completion_tokens": MAX_TOKENS - 1, "usage.extra": [1]}))
    assert all(rec.ok for rec in result.records), [rec.error for rec in result.records]
    assert invalid_reasons(result.records, 0.0, None, None) == []
    assert [rec.cached_tokens for rec in result.records] == [8] * SESSIONS


def test_a_server_that_ignores_max_tokens_is_stopped_at_once():
    # Without the check the stream ran until request_timeout_s, and three in a row aborted the run as
    # "engine unreachable" although tokens kept arriving.
    result, log, _ = run(fast(ignore_max_tokens=True), request_timeout_s=5, stall_timeout_s=5)
    assert len(result.records) == SESSIONS and result.aborted is None
    for rec in result.records:
        assert (
            rec.error
            == f"bad_answer: server ignored max_tokens: {MAX_TOKENS + 1} tokens streamed, max_tokens {MAX_TOKENS}"
        )
        assert sum(tokens for _, tokens in rec.chunks) == MAX_TOKENS + 1  # read one token past, then left
    # The server, one token a ms, noticed the client leave well before request_timeout_s (5,000 tokens).
    assert all(MAX_TOKENS + 1 <= sent < 1000 for sent in log.tokens_sent), log.tokens_sent


def test_an_event_past_the_bound_fails_naming_the_bound():
    result, _, _ = run(fast(first_event_bytes=3 << 20), sessions=1, max_event_bytes=1 << 20)
    (rec,) = result.records
    assert rec.error == "malformed_sse: an SSE event is past 1,048,576 bytes (1 MiB, the client's max_event_bytes)"


def test_the_sse_bound_counts_an_event_across_its_lines_and_chunks():
    parser = SSEParser(max_event_bytes=100)
    assert parser.feed(b"data: " + b"x" * 60 + b"\n") == []
    with pytest.raises(EventTooLarge, match="past 100 bytes"):
        for _ in range(10):
            parser.feed(b"data: " + b"y" * 10)  # the second line, unfinished, takes the event past 100 bytes
    parser = SSEParser(max_event_bytes=100)
    for _ in range(50):  # many events under the bound: each one counts alone
        assert parser.feed(b"data: " + b"z" * 90 + b"\n\n") == ["z" * 90]


def test_a_reasoning_models_thinking_is_content_but_not_answer_text():
    # vLLM's and SGLang's reasoning parsers stream the thinking as delta.reasoning_content (or .reasoning): a
    # request that spent its max_tokens thinking produced content, not "no content".
    from kvbench.harness.stream_answer import API_CHAT, AnswerLimits, AnswerReader

    reader = AnswerReader(API_CHAT, AnswerLimits(max_tokens=2))
    for arrival, key in enumerate(("reasoning_content", "reasoning"), start=1):
        payload = '{"choices": [{"delta": {"%s": "hm", "content": null}}]}' % key
        assert reader.take(payload, arrival) is None
    assert reader.finish() is None
    answer = reader.answer(0, 200, 3, None)
    assert answer.text == "" and answer.chunks == [[1, 1], [2, 1]] and answer.first_token_ns == 1


def test_a_stream_without_end_is_cut_at_request_timeout_s():
    # A long answer within max_tokens that the server streams without a pause: Python 3.11's wait_for, cancelled
    # as a read completes, swallowed the cancellation and the request ran on far past request_timeout_s (it
    # hung a 2 s request for more than 40 s). The run goes in a thread of its own so that a hang fails here.
    import threading

    outcome = {}

    def play():
        async def go():
            async with serving(
                InstrumentBehaviour(first_token_ms=1, chunk_interval_ms=0.2, ignore_max_tokens=True)
            ) as (url, _):
                generator = LoadGenerator(
                    EndpointConfig(base_url=url, model="m", request_timeout_s=1), LoadSpec(concurrency=1), run_id="long"
                )
                return await generator.run(workload(sessions=2, max_tokens=10**9))

        outcome["result"] = asyncio.run(go())

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    thread.join(timeout=60)  # 2 requests of 1 s each: 60 s is far past any load's delay
    assert not thread.is_alive(), "a request ran on past request_timeout_s"
    assert [rec.error for rec in outcome["result"].records] == ["timeout: no complete answer within 1 s"] * 2
