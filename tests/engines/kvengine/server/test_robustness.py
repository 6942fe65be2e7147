"""A bad input, a bad request or a bad client never takes the server down (issue 13): sampling parameters
checked at the boundary, malformed bodies answered precisely, a request whose step fails failing alone,
clients that leave freeing their pages, oversized prompts refused without blocking the event loop."""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
import urllib.request

import pytest

import kvbench.engines.kvengine.runtime.engine as engine_module
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.settings.config import EngineConfig

from .server_fixture import serving

PROMPT = list(range(300, 340))
BODY = {
    "model": "tiny",
    "prompt": PROMPT,
    "max_tokens": 4,
    "temperature": 0,
    "ignore_eos": True,
    "return_token_ids": True,
}


@pytest.fixture(scope="module")
def served():
    engine = Engine(EngineConfig(kv_capacity=8192, max_model_len=4096, served_model_name="tiny"), tiny_loaded_model(5))
    with serving(engine) as base:
        yield engine, base


@pytest.fixture
def url(served):
    return served[1]


def send(url, path, body, method="POST", raw: bytes | None = None):
    """(status, parsed JSON body or text) of one request; `raw` sends those bytes as the body."""
    data = raw if raw is not None else json.dumps(body).encode()  # json.dumps writes NaN and Infinity
    request = urllib.request.Request(
        url + path, data=data if method == "POST" else None, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, _decode(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _decode(exc.read())


def _decode(data: bytes):
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def served_ok(url) -> list[int]:
    status, body = send(url, "/v1/completions", BODY)
    assert status == 200, body
    return body["choices"][0]["token_ids"]


def settled(engine: Engine, timeout_s: float = 60.0) -> None:
    """Wait (bounded) until the engine runs nothing, then check that no page leaked."""
    deadline = time.monotonic() + timeout_s
    while engine.scheduler.has_work() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.scheduler.has_work(), "the engine still runs a request"
    engine.pool.check_integrity()
    engine.index.check_integrity()
    assert engine.pool.num_free == engine.pool.capacity - engine.index.cached_pages  # only cached pages held


# --- 1. sampling parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -math.inf])
def test_a_temperature_that_is_not_finite_is_a_400_and_the_next_request_is_served(served, temperature):
    engine, url = served
    status, body = send(url, "/v1/completions", {**BODY, "temperature": temperature})
    assert status == 400 and body["error"]["param"] == "temperature", body
    assert len(served_ok(url)) == 4
    assert send(url, "/health", None, "GET")[0] == 200
    settled(engine)


def test_a_temperature_below_1e_5_is_greedy(served):
    engine, url = served
    greedy = served_ok(url)
    for temperature in (1e-40, 1e-6):
        status, body = send(url, "/v1/completions", {**BODY, "temperature": temperature})
        assert status == 200, body
        assert body["choices"][0]["token_ids"] == greedy
    settled(engine)


@pytest.mark.parametrize("seed", [2**64, 2**63, -(2**63) - 1])
def test_a_seed_outside_64_bit_range_is_a_400_and_the_next_request_is_served(served, seed):
    engine, url = served
    status, body = send(url, "/v1/completions", {**BODY, "temperature": 1.0, "seed": seed})
    assert status == 400 and body["error"]["param"] == "seed", body
    assert len(served_ok(url)) == 4
    settled(engine)


def test_the_widest_seeds_are_served(served):
    _, url = served
    for seed in (2**63 - 1, -(2**63)):
        assert send(url, "/v1/completions", {**BODY, "temperature": 1.0, "seed": seed})[0] == 200


# --- malformed bodies -------------------------------------------------------------------------------------

COMPLETION_CASES = [
    # (body overrides, expected status, field named in `param`, or a word of the message)
    ({"prompt": None}, 400, "prompt"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": {"a": 1}}, 400, "prompt"),
    ({"prompt": [[1, 2], [3]]}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": [True, False]}, 400, "prompt"),
    ({"prompt": [1.5]}, 400, "prompt"),
    ({"prompt": [-1]}, 400, "vocabulary"),
    ({"prompt": [512]}, 400, "vocabulary"),
    ({"prompt": [2**40]}, 400, "vocabulary"),
    ({"max_tokens": "5"}, 400, "max_tokens"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": -1}, 400, "max_tokens"),
    ({"max_tokens": 1.5}, 400, "max_tokens"),
    ({"max_tokens": True}, 400, "max_tokens"),
    ({"max_tokens": 10**30}, 400, "max_tokens"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"temperature": -0.5}, 400, "temperature"),
    ({"temperature": True}, 400, "temperature"),
    ({"temperature": [1]}, 400, "temperature"),
    ({"temperature": 10**400}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"top_p": 1.5}, 400, "top_p"),
    ({"top_p": math.nan}, 400, "top_p"),
    ({"top_p": "x"}, 400, "top_p"),
    ({"top_k": 5}, 400, "top_k"),
    ({"top_k": -2}, 400, "top_k"),
    ({"top_k": "x"}, 400, "top_k"),
    ({"seed": 1.5}, 400, "seed"),
    ({"seed": "1"}, 400, "seed"),
    ({"seed": True}, 400, "seed"),
    ({"n": 2}, 400, "n"),
    ({"n": 0}, 400, "n"),
    ({"n": "1"}, 400, "n"),
    ({"stop": 5}, 400, "stop"),
    ({"stop": [1]}, 400, "stop"),
    ({"stop": [None]}, 400, "stop"),
    ({"stop_token_ids": "x"}, 400, "stop_token_ids"),
    ({"stop_token_ids": [1.5]}, 400, "stop_token_ids"),
    ({"stop_token_ids": [True]}, 400, "stop_token_ids"),
    ({"stream": "yes"}, 400, "stream"),
    ({"stream": 1}, 400, "stream"),
    ({"stream_options": "x"}, 400, "stream_options"),
    ({"echo": "yes"}, 400, "echo"),
    ({"logprobs": 21}, 400, "logprobs"),
    ({"logprobs": -1}, 400, "logprobs"),
    ({"logprobs": "x"}, 400, "logprobs"),
    ({"ignore_eos": "no"}, 400, "ignore_eos"),
    ({"return_token_ids": 1}, 400, "return_token_ids"),
    ({"model": "gpt-9"}, 404, "model"),
    ({"model": 5}, 400, "model"),
    ({"tenant": "someone-else"}, 403, "tenant"),
]

CHAT_CASES = [
    ({"messages": None}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": ["hi"]}, 400, "messages"),
    ({"messages": [{"role": "user"}]}, 400, "messages"),
    ({"messages": [{"content": "x"}]}, 400, "messages"),
    ({"messages": [{"role": 1, "content": "x"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ({"max_completion_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": "x"}, 400, "max_tokens"),
    ({"logprobs": "yes"}, 400, "logprobs"),
    ({"logprobs": True, "top_logprobs": 30}, 400, "top_logprobs"),
    ({"temperature": math.nan}, 400, "temperature"),
]

RAW_CASES = [
    (b"{", 400, "JSON"),
    (b"", 400, "JSON"),
    (b"\xff\xfe{}", 400, "JSON"),
    (b"[]", 400, "object"),
    (b'"x"', 400, "object"),
    (b"null", 400, "object"),
    (b"1" * 5000, 400, "JSON"),  # beyond Python's integer-string limit
]


def check_error(status, body, expected_status, field):
    assert status == expected_status, body
    error = body["error"]
    assert error["code"] == expected_status
    assert error["param"] == field or field in error["message"], error


@pytest.mark.parametrize("overrides, status, field", COMPLETION_CASES)
def test_a_malformed_completion_field_gets_a_precise_error(url, overrides, status, field):
    check_error(*send(url, "/v1/completions", {**BODY, **overrides}), status, field)


@pytest.mark.parametrize("overrides, status, field", CHAT_CASES)
def test_a_malformed_chat_field_gets_a_precise_error(url, overrides, status, field):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **overrides}
    check_error(*send(url, "/v1/chat/completions", body), status, field)


@pytest.mark.parametrize("raw, status, word", RAW_CASES)
def test_a_body_that_is_not_a_json_object_gets_a_400(url, raw, status, word):
    check_error(*send(url, "/v1/completions", None, raw=raw), status, word)


def test_wrong_methods_and_paths_get_405_and_404_and_the_engine_is_left_clean(served):
    engine, url = served
    assert send(url, "/v1/completions", None, "GET")[0] == 405
    assert send(url, "/v1/nothing", {})[0] == 404
    assert len(served_ok(url)) == 4
    settled(engine)


# --- 2. a step that fails for one request -----------------------------------------------------------------

POISON_SEED = 4242  # the request whose sampling the test makes raise


def test_a_request_whose_step_fails_fails_alone_and_its_pages_are_freed(served, monkeypatch):
    engine, url = served
    real_sample = engine_module.sample

    def sample(logits, params, generators):
        if any(p.seed == POISON_SEED for p in params):
            raise RuntimeError("injected: this request's sampling fails")
        return real_sample(logits, params, generators)

    monkeypatch.setattr(engine_module, "sample", sample)
    alone = served_ok(url)
    results: dict[str, tuple] = {}
    poisoned = {**BODY, "temperature": 1.0, "seed": POISON_SEED, "prompt": list(range(100, 190))}

    def call(name, body):
        results[name] = send(url, "/v1/completions", body)

    threads = [threading.Thread(target=call, args=(f"good{i}", BODY)) for i in range(3)]
    threads.append(threading.Thread(target=call, args=("bad", poisoned)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    status, body = results["bad"]
    assert status == 500 and "injected" in body["error"]["message"]
    for i in range(3):
        status, body = results[f"good{i}"]
        assert status == 200 and body["choices"][0]["token_ids"] == alone
    settled(engine)
    assert send(url, "/health", None, "GET")[0] == 200
    assert served_ok(url) == alone


# --- 3. a non-streaming client that leaves ----------------------------------------------------------------


def finished_count(engine: Engine, reason: str) -> float:
    return engine.metrics.requests.labels(engine.model_name, reason)._value.get()


def test_a_non_streaming_client_that_leaves_is_aborted_and_frees_its_sequence(served):
    engine, url = served
    settled(engine)
    aborted, lengths = finished_count(engine, "abort"), finished_count(engine, "length")
    host, port = urllib.parse.urlparse(url).netloc.split(":")
    body = json.dumps({**BODY, "max_tokens": 4000}).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 60
        while not engine.scheduler.num_running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.scheduler.num_running == 1, "the request never started"
    # The client is gone. Left alone the request would generate 4000 tokens and finish with "length".
    settled(engine, timeout_s=120)
    assert finished_count(engine, "abort") == aborted + 1
    assert finished_count(engine, "length") == lengths


# --- 4. oversized prompts ---------------------------------------------------------------------------------


def test_a_20_mb_prompt_is_refused_while_health_keeps_answering(served, monkeypatch):
    """Refused from its Content-Length, before it is read or tokenised (before the fix one /health waited
    31 s behind the tokenizer): the tokenizer never sees it, and /health answers throughout."""
    engine, url = served
    seen: list[int] = []

    class Spy:  # the served tokenizer, noting the length of every text it is asked to encode
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        def __call__(self, text, *args, **kwargs):
            seen.append(len(text))
            return self.tokenizer(text, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.tokenizer, name)

    monkeypatch.setattr(engine, "loaded", dataclasses.replace(engine.loaded, tokenizer=Spy(engine.loaded.tokenizer)))
    host, port = urllib.parse.urlparse(url).netloc.split(":")
    body = json.dumps({**BODY, "prompt": "a" * 20_000_000}).encode()
    outcome: dict[str, object] = {}

    def big() -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=300)
        connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        outcome["status"], outcome["body"] = reply.status, json.loads(reply.read())

    thread = threading.Thread(target=big)
    thread.start()
    answered = 0
    while thread.is_alive() or answered < 3:
        assert send(url, "/health", None, "GET")[0] == 200
        answered += 1
    thread.join()
    assert outcome["status"] == 413, outcome
    assert len(served_ok(url)) == 4
    assert send(url, "/v1/completions", {**BODY, "prompt": "a text"})[0] == 200
    assert seen == [len("a text")]  # the spy sees what is tokenised, and the 20 MB prompt never was
    settled(engine)


def test_a_text_longer_than_the_context_could_hold_is_refused_before_it_is_tokenised(served):
    engine, url = served
    limit = engine.max_model_len * 64
    status, body = send(url, "/v1/completions", {**BODY, "prompt": "a" * (limit + 1)})
    assert status == 400 and body["error"]["param"] == "prompt" and "characters" in body["error"]["message"]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "a" * (limit + 1)}]}
    status, body = send(url, "/v1/chat/completions", chat)
    assert status == 400 and body["error"]["param"] == "messages"
