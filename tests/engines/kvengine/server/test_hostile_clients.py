"""Hostile and careless clients (issue 28): no request can stall the others or leak what a client sent.

Deep JSON bodies, chats whose template makes them long, long chats beside a normal request, clients that
leave by the hundred, oversized headers and fields this engine would ignore: each refused precisely (an
OpenAI-shaped JSON error naming the field), before its cost is paid, with no ERROR line in the log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
import urllib.parse

import pytest

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.settings.config import EngineConfig

from .server_fixture import serving
from .test_robustness import BODY, send, served_ok, settled

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def served():
    # An 8192-token context: bodies up to 4 MB, text up to 524,288 characters (protocol.max_prompt_chars).
    engine = Engine(EngineConfig(kv_capacity=8192, max_model_len=8192, served_model_name="tiny"), tiny_loaded_model(5))
    with serving(engine) as base:
        yield engine, base


def metric(url: str, name: str, **labels: str) -> float | None:
    """A sample of /metrics (None when the server exports no such sample)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = send(url, "/metrics", None, "GET")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


class TokenizerSpy:
    """The served tokenizer, noting every text it encodes and every chat it templates."""

    def __init__(self, tokenizer, seen: list[str]) -> None:
        self.tokenizer, self.seen = tokenizer, seen

    def __call__(self, text, *args, **kwargs):
        self.seen.append(f"encode {len(text)}")
        return self.tokenizer(text, *args, **kwargs)

    def apply_chat_template(self, messages, *args, **kwargs):
        self.seen.append(f"template {len(messages)}")
        return self.tokenizer.apply_chat_template(messages, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.fixture
def spied(served, monkeypatch) -> list[str]:
    engine, _ = served
    seen: list[str] = []
    spy = TokenizerSpy(engine.loaded.tokenizer, seen)
    monkeypatch.setattr(engine, "loaded", dataclasses.replace(engine.loaded, tokenizer=spy))
    return seen


def is_openai_error(body, status: int) -> bool:
    return isinstance(body, dict) and body["error"]["code"] == status and isinstance(body["error"]["message"], str)


# --- bodies nested deep, and every error in the OpenAI shape ------------------------------------------------

DEEP = 100_000


@pytest.mark.parametrize(
    "path, raw",
    [
        ("/v1/completions", b"[" * DEEP + b"]" * DEEP),
        ("/v1/completions", json.dumps({**BODY, "prompt": "@"}).encode().replace(b'"@"', b"[" * DEEP + b"]" * DEEP)),
        ("/v1/chat/completions", json.dumps(CHAT).encode().replace(b'"hi"', b'{"a":' * DEEP + b"1" + b"}" * DEEP)),
    ],
)
def test_a_body_nested_100000_deep_is_a_400_naming_the_depth_and_the_server_goes_on(served, path, raw):
    """Before: 500 "Server got itself in trouble" as plain text, and a RecursionError traceback."""
    engine, url = served
    status, body = send(url, path, None, raw=raw)
    assert status == 400 and is_openai_error(body, 400), body
    assert "levels deep" in body["error"]["message"]
    assert len(served_ok(url)) == 4
    assert send(url, "/v1/completions", {**BODY, "prompt": "[" * 1000})[0] == 200  # brackets in a string: no depth
    settled(engine)


@pytest.mark.parametrize("path, method, status", [("/v1/nothing", "POST", 404), ("/v1/completions", "GET", 405)])
def test_routing_errors_are_openai_errors_too(served, path, method, status):
    _, url = served
    got, body = send(url, path, {}, method)
    assert got == status and is_openai_error(body, status), body


# --- chats whose template makes them long -------------------------------------------------------------------


def test_a_100000_message_chat_is_refused_before_it_reaches_the_tokenizer(served, spied):
    """Before: 3.6 s of templating and tokenising 900,011 tokens, then a 400."""
    _, url = served
    chat = {**CHAT, "messages": [{"role": "user", "content": "x"}] * 100_000}
    status, body = send(url, "/v1/chat/completions", None, raw=json.dumps(chat, separators=(",", ":")).encode())
    assert status == 400 and "2048" in body["error"]["message"], body  # refused from the raw bytes, unparsed
    assert spied == []
    chat["messages"] = chat["messages"][:2049]
    status, body = send(url, "/v1/chat/completions", chat)  # parsed, but one message over the cap
    assert status == 400 and body["error"]["param"] == "messages" and "2048" in body["error"]["message"], body
    assert spied == []


def test_a_chat_under_the_cap_whose_template_overflows_the_context_is_refused_untokenised(served, spied):
    """2000 messages of 250 characters: 508,000 characters of text (under the 524,288 an 8192-token context is
    given), but the template's 24 characters per message make it ~556,000: it cannot fit."""
    _, url = served
    chat = {**CHAT, "messages": [{"role": "user", "content": "y" * 250}] * 2000}
    status, body = send(url, "/v1/chat/completions", chat)
    assert status == 400 and body["error"]["param"] == "messages" and "template" in body["error"]["message"], body
    assert spied == []
    assert send(url, "/v1/chat/completions", CHAT)[0] == 200
    assert spied == ["template 1", "encode 52"]  # the normal chat: templated, then its 52 characters tokenised


# --- long chats beside a normal request ---------------------------------------------------------------------

BIG_CHAT = {**CHAT, "messages": [{"role": "user", "content": "z" * 220}] * 2000}  # ~496,000 templated characters


def test_five_long_chats_never_hold_a_normal_request_and_the_large_lane_is_bounded(served):
    """Before: five 100,000-message chats held a normal request 15.3 s on the one tokenizer thread. Now the
    normal request runs in the small lane, and finishes while the large lane still works; the large lane
    takes what its character budget holds and answers the rest 429 with Retry-After, each counted."""
    engine, url = served
    rejected_before = metric(url, "kvbench:tokenize_rejected_total", lane="large") or 0.0
    done: list[tuple[str, int, dict]] = []  # (name, status, headers) in the order they finished
    lock = threading.Lock()

    def call(name: str, body: dict) -> None:
        import urllib.request

        request = urllib.request.Request(
            url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as reply:
                status, headers = reply.status, dict(reply.headers)
        except urllib.error.HTTPError as exc:
            status, headers = exc.code, dict(exc.headers)
        with lock:
            done.append((name, status, headers))

    bigs = [threading.Thread(target=call, args=(f"big{i}", BIG_CHAT)) for i in range(5)]
    for thread in bigs:
        thread.start()
    deadline, saw_saturated = time.monotonic() + 60, False
    while time.monotonic() < deadline and not (metric(url, "kvbench:tokenize_queue_depth", lane="large") or 0):
        time.sleep(0.01)
    status, ready = send(url, "/ready", None, "GET")
    saw_saturated = status == 503 and ready["saturated_lanes"] == ["large"]
    normal = threading.Thread(target=call, args=("normal", CHAT))
    normal.start()
    normal.join(120)
    depth_when_normal_done = metric(url, "kvbench:tokenize_queue_depth", lane="large")
    for thread in bigs:
        thread.join(300)
    order = [name for name, _, _ in done]
    statuses = {name: status for name, status, _ in done}
    assert statuses["normal"] == 200
    admitted = [name for name in order if name.startswith("big") and statuses[name] == 400]  # tokenised, too long
    refused = [name for name, status, headers in done if status == 429 and headers.get("Retry-After") == "1"]
    assert len(admitted) + len(refused) == 5 and admitted and refused, done
    assert order.index("normal") < order.index(admitted[-1])  # not queued behind the long chats
    assert depth_when_normal_done and depth_when_normal_done >= 1
    assert saw_saturated
    assert metric(url, "kvbench:tokenize_rejected_total", lane="large") == rejected_before + len(refused)
    assert metric(url, "kvbench:tokenize_queue_depth", lane="large") == 0
    assert send(url, "/ready", None, "GET")[0] == 200
    settled(engine)


# --- clients that leave -------------------------------------------------------------------------------------


def test_300_streaming_clients_leaving_log_no_error_and_are_counted(served, caplog):
    """Before: 300 ERROR tracebacks (`Cannot write to closing transport`, ~7,500 lines)."""
    engine, url = served
    settled(engine)
    left_before = metric(url, "kvbench:client_disconnects_total") or 0.0
    host, port = urllib.parse.urlparse(url).netloc.split(":")
    body = json.dumps({**BODY, "max_tokens": 3000, "stream": True}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    with caplog.at_level(logging.DEBUG):
        sockets = []
        for _ in range(300):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head + body)
            sockets.append(sock)
        for sock in sockets:
            sock.settimeout(60)
            assert sock.recv(12).startswith(b"HTTP/1.1 200")  # the stream began
            sock.close()
        settled(engine, timeout_s=180)
        deadline = time.monotonic() + 60
        while (metric(url, "kvbench:client_disconnects_total") or 0) < left_before + 300:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors[0].getMessage()
    assert metric(url, "kvbench:client_disconnects_total") == left_before + 300
    assert len([r for r in caplog.records if r.getMessage().startswith("client left")]) == 300
    assert len(served_ok(url)) == 4


# --- headers are never echoed -------------------------------------------------------------------------------


def raw_exchange(url: str, request: bytes) -> bytes:
    host, port = urllib.parse.urlparse(url).netloc.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize(
    "header, status",
    [
        (b"Authorization: Bearer sk-SECRETKEY" + b"A" * 100_000, 431),
        (b"X-Tenant: sk-SECRETKEY\x01", 400),
    ],
)
def test_a_bad_header_is_answered_and_logged_by_name_never_by_value(served, caplog, header, status):
    """Before: a 100 kB Authorization header got 400 with `Bearer <start of the key>` in the body and the log."""
    _, url = served
    with caplog.at_level(logging.DEBUG):
        reply = raw_exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split()[1] == str(status).encode(), head
    assert is_openai_error(json.loads(body), status)
    assert b"SECRET" not in reply
    assert not any("SECRET" in r.getMessage() or "SECRET" in str(r.exc_info) for r in caplog.records)
    assert send(url, "/health", None, "GET")[0] == 200


# --- fields this engine would ignore, and strict booleans ---------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("best_of", 100),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1),
        ("logit_bias", {"5": 10}),
        ("suffix", "end"),
        ("min_tokens", 3),
        ("use_beam_search", True),
    ],
)
def test_a_field_this_engine_would_ignore_is_a_400_naming_it(served, field, value):
    _, url = served
    status, body = send(url, "/v1/completions", {**BODY, field: value})
    assert status == 400 and body["error"]["param"] == field, body


def test_tools_in_a_chat_are_refused_and_no_op_values_are_served(served):
    _, url = served
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    status, body = send(url, "/v1/chat/completions", {**CHAT, "tools": tools})
    assert status == 400 and body["error"]["param"] == "tools", body
    no_ops = {"best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u1"}
    assert send(url, "/v1/completions", {**BODY, **no_ops})[0] == 200


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_include_usage_must_be_a_boolean(served, value):
    _, url = served
    status, body = send(url, "/v1/completions", {**BODY, "stream": True, "stream_options": {"include_usage": value}})
    assert status == 400 and body["error"]["param"] == "stream_options.include_usage", body
