"""Inputs bounded whatever their encoding or size (issue 46): UTF-16/32 bodies against the admission bounds,
stop lists at their bound, error messages that cut the value they refuse, and streaming clients that stop
reading: ended after the stall timeout, their slots and pages freed, counted in /metrics; /ready says
"saturated" while every sequence slot is held."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse

import pytest

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.server.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS
from kvbench.engines.kvengine.settings.config import EngineConfig

from .server_fixture import serving
from .test_hostile_clients import is_openai_error, metric
from .test_robustness import BODY, send, served_ok, settled

SLOTS = 2


@pytest.fixture(scope="module")
def served():
    engine = Engine(
        EngineConfig(kv_capacity=16384, max_model_len=8192, max_num_seqs=SLOTS, served_model_name="tiny"),
        tiny_loaded_model(5),
    )
    with serving(engine, stall_timeout_s=3.0) as base:
        yield engine, base


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
@pytest.mark.parametrize(
    "shape, word",
    [
        (lambda: "[" * 100_000 + "]" * 100_000, "levels deep"),
        (lambda: json.dumps({**BODY, "extra": [{}] * 100_000}), "objects and arrays"),
    ],
)
def test_a_body_in_any_json_encoding_meets_the_same_bounds(served, encoding, shape, word):
    """Before: UTF-16-LE nested 100,000 deep was a 500 (RecursionError); 300,000 `{}` were served (200)."""
    engine, url = served
    status, body = send(url, "/v1/completions", None, raw=shape().encode(encoding))
    assert status == 400 and is_openai_error(body, 400) and word in body["error"]["message"], body
    status, body = send(url, "/v1/completions", None, raw=json.dumps(BODY).encode(encoding))
    assert status == 200, body  # a well-formed body in another encoding is served
    settled(engine)


def test_a_body_that_is_not_text_in_its_encoding_is_a_400(served):
    _, url = served
    status, body = send(url, "/v1/completions", None, raw='{"prompt": "'.encode("utf-16-le") + b"\x00\xd8" + b"}\x00")
    assert status == 400 and "not valid utf-16-le text" in body["error"]["message"], body


def test_a_stop_list_at_its_bound_is_served_and_one_past_it_is_a_400_naming_stop(served):
    """Before: 300,000 stop strings were searched after every token on the event loop (25 s)."""
    _, url = served
    at_bound = [f"{i:0{MAX_STOP_CHARS // MAX_STOP_STRINGS - 1}d}~" for i in range(MAX_STOP_STRINGS)]
    assert sum(map(len, at_bound)) == MAX_STOP_CHARS
    assert send(url, "/v1/completions", {**BODY, "stop": at_bound})[0] == 200
    for past in (at_bound + ["x"], at_bound[:-1] + [at_bound[-1] + "x"], ["x"] * 300_000):
        status, body = send(url, "/v1/completions", {**BODY, "stop": past})
        assert status == 400 and body["error"]["param"] == "stop", body


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", "x" * 3_000_000),
        ("max_tokens", 10**3999),
        ("model", ["y" * 100_000] * 10),
        ("seed", -(10**3999)),
    ],
    ids=["3MB-temperature", "4000-digit-max_tokens", "list-model", "4000-digit-seed"],
)
def test_an_error_names_the_field_and_cuts_the_value(served, field, value):
    """Before: the whole 3 MB value, or all 4,000 digits, came back in the message."""
    _, url = served
    status, body = send(url, "/v1/completions", {**BODY, field: value})
    assert status == 400 and is_openai_error(body, 400), body
    assert body["error"]["message"].startswith(field) and len(body["error"]["message"]) < 200, body


def stream_never_read(url: str, stream: bool = True) -> socket.socket:
    """A long request whose client reads nothing (a small receive window, so the server's writes back up)."""
    return stream_never_read_body(url, {**BODY, "max_tokens": 8000, "stream": stream, "logprobs": 20})


def stream_never_read_body(url: str, request: dict) -> socket.socket:
    """`request` sent from a socket with a small receive window, of which nothing is read yet."""
    host, port = urllib.parse.urlparse(url).netloc.split(":")
    body = json.dumps(request).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def wait_until(condition, failure: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)


def test_streams_whose_clients_stop_reading_are_parked_then_ended(served):
    """Before: such streams held every max_num_seqs slot (to max_tokens, later to the stall timeout) while
    normal requests waited for one. Now each is parked once its socket backs up (no slot, no device page),
    a normal request is served beside them, and they are ended after the stall timeout."""
    engine, url = served
    settled(engine)
    stalled_before = metric(url, "kvbench:client_stalled_total") or 0.0
    parked_before = metric(url, "kvbench:requests_parked_total") or 0.0
    sockets = [stream_never_read(url) for _ in range(SLOTS)]
    try:
        wait_until(lambda: metric(url, "kvbench:num_requests_parked") == SLOTS, "the streams were not parked")
        assert metric(url, "kvbench:num_requests_running") == 0  # they hold no slot
        assert len(served_ok(url)) == 4 and send(url, "/ready", None, "GET")[0] == 200
        wait_until(
            lambda: metric(url, "kvbench:client_stalled_total") == stalled_before + SLOTS,
            "the stalled streams were not ended",
        )
        wait_until(lambda: metric(url, "kvbench:num_requests_parked") == 0, "ended streams stayed parked")
        settled(engine)  # their requests aborted, every page back
    finally:
        for sock in sockets:
            sock.close()
    assert metric(url, "kvbench:requests_parked_total") >= parked_before + SLOTS


def test_ready_says_saturated_while_every_slot_is_held(served):
    """Before: 16 long requests held every slot while /ready said "ready"."""
    engine, url = served
    settled(engine)
    sockets = [stream_never_read(url, stream=False) for _ in range(SLOTS)]  # nothing written before the end
    try:
        wait_until(lambda: send(url, "/ready", None, "GET")[0] == 503, "/ready never said saturated")
        status, ready = send(url, "/ready", None, "GET")
        assert ready["status"] == "saturated" and ready["max_num_seqs"] == SLOTS, ready
    finally:
        for sock in sockets:
            sock.close()  # the handlers notice within their poll and abort the requests
    settled(engine)
    assert send(url, "/ready", None, "GET")[0] == 200


def test_a_slow_reader_is_parked_and_resumed_and_gets_the_same_answer(served):
    """A client that reads in bursts is parked whenever its socket backs up and resumed when it reads: its
    request recomputes from its cached pages, and the tokens it receives are the ones a fast client gets."""
    engine, url = served
    settled(engine)
    body = {**BODY, "max_tokens": 400, "logprobs": 20}
    status, whole = send(url, "/v1/completions", body)
    assert status == 200, whole
    parked_before = metric(url, "kvbench:requests_parked_total") or 0.0
    sock = stream_never_read_body(url, {**body, "stream": True})
    received, end = bytearray(), b"\r\n0\r\n\r\n"  # the last chunk of a chunked body
    try:
        sock.settimeout(60)
        while not received.endswith(end):
            time.sleep(0.2)  # a pause long enough for its socket to fill and its request to be parked
            for _ in range(8):
                chunk = sock.recv(4096)
                assert chunk, "the server closed the stream"
                received += chunk
                if received.endswith(end):
                    break
    finally:
        sock.close()
    streamed = []
    for event in dechunked(bytes(received).split(b"\r\n\r\n", 1)[1]).split(b"\n\n"):
        if event.startswith(b"data: {"):
            streamed += json.loads(event[6:])["choices"][0].get("token_ids") or []
    assert streamed == whole["choices"][0]["token_ids"]
    assert (metric(url, "kvbench:requests_parked_total") or 0.0) > parked_before  # it was parked, and resumed
    settled(engine)


def dechunked(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body's data."""
    data, at = bytearray(), 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end], 16)
        if size == 0:
            return bytes(data)
        data += body[line_end + 2 : line_end + 2 + size]
        at = line_end + 2 + size + 2
