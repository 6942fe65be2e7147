"""The client's fast path (SSE payloads kept as bytes, split on LF, decoded by the typed decoder from bytes)
accepts and refuses exactly what the general path does: the parser as it was (each line matched, each data line
decoded to text) with `[DONE]` found in the stripped text and each payload parsed as text.

Streams are drawn as events of any payload (a possible chunk with any JSON in its fields, `[DONE]` within any
whitespace, arbitrary bytes, invalid UTF-8 inside a JSON string), framed with any line ends, comments, other
fields and several data lines, cut anywhere into network reads; both paths must give the same payload
outcomes, the same answer and the same refusal (an event past the bound included).
"""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.harness.instrument import overridden
from kvbench.harness.sse import EventTooLarge, SSEParser, is_done
from kvbench.harness.stream_answer import API_CHAT, API_COMPLETIONS, AnswerLimits, AnswerReader, parse_payload

from .test_server_answers_property import CHUNK_PATHS, JSON


class ReferenceParser:
    """The SSE parser before the fast path, kept as the slow, obvious reference: every line end matched by a
    regular expression, every data line decoded to text on its own, the text lines joined."""

    _LINE_END = re.compile(rb"\r\n|\r|\n")

    def __init__(self, max_event_bytes: int) -> None:
        self.partial, self.data, self.data_bytes, self.after_cr = bytearray(), [], 0, False
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[str]:
        events: list[str] = []
        if not chunk:
            return events
        position = 1 if self.after_cr and chunk[:1] == b"\n" else 0
        self.after_cr = False
        for match in self._LINE_END.finditer(chunk, position):
            self.check(len(self.partial) + match.start() - position)
            line = bytes(self.partial) + chunk[position : match.start()]
            self.partial.clear()
            self.line(line, events)
            position = match.end()
        if position < len(chunk):
            self.check(len(self.partial) + len(chunk) - position)
            self.partial += chunk[position:]
        elif chunk.endswith(b"\r"):
            self.after_cr = True
        return events

    def close(self) -> list[str]:
        events: list[str] = []
        if self.partial:
            self.line(bytes(self.partial), events)
        if self.data:
            events.append("\n".join(self.data))
        return events

    def check(self, line_bytes: int) -> None:
        if self.data_bytes + line_bytes > self.max_event_bytes:
            raise EventTooLarge("past the bound")

    def line(self, raw: bytes, events: list[str]) -> None:
        if not raw:
            if self.data:
                events.append("\n".join(self.data))
                self.data, self.data_bytes = [], 0
            return
        if raw[:1] == b":":
            return
        field, sep, value = raw.partition(b":")
        if field != b"data":
            return
        if sep and value[:1] == b" ":
            value = value[1:]
        self.data.append(value.decode("utf-8", errors="replace"))
        self.data_bytes += len(value) + 1


BAD_UTF8 = st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x80abc", b"\xf0\x9f\x98"])


@st.composite
def payloads(draw) -> bytes:
    kind = draw(st.sampled_from(["chunk", "chunk", "chunk", "error", "done", "bytes"]))
    if kind == "done":
        space = st.sampled_from(["", " ", "\t", "\n", "\u00a0", "\x1c", "\u2003", "\x85"])
        return (draw(space) + "[DONE]" + draw(space)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "error":  # a server's error event, with or without choices
        event = {"error": draw(st.fixed_dictionaries({"message": st.text(max_size=6)}) | JSON)}
        if draw(st.booleans()):
            event["choices"] = draw(st.sampled_from([[], [{"text": "a"}], None]))
    else:
        event = {
            "choices": [
                {"index": 0, "text": " a", "delta": {"content": " a"}, "token_ids": [7], "finish_reason": None}
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}},
        }
        overrides = draw(st.dictionaries(st.sampled_from(CHUNK_PATHS), JSON, max_size=3))
        event = overridden(event, dict(sorted(overrides.items(), key=lambda item: len(item[0]))))
    text = json.dumps(event, ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):  # invalid bytes just inside a JSON string (a key or a value: the text, a reason)
        at = draw(st.sampled_from([i + 1 for i, c in enumerate(text) if c == '"']))
        return text[:at].encode() + draw(BAD_UTF8) + text[at:].encode()
    return text.encode()


@st.composite
def streams(draw) -> bytes:
    end = st.sampled_from([b"\n", b"\n", b"\r\n", b"\r"])
    out = b""
    for payload in draw(st.lists(payloads(), min_size=1, max_size=6)):
        if draw(st.booleans()):
            out += draw(st.sampled_from([b": keep-alive", b"event: x", b"id: 3", b"retry"])) + draw(end)
        lines = payload.split(b"\n") if draw(st.booleans()) else [payload]
        for line in lines:
            out += draw(st.sampled_from([b"data: ", b"data:", b"data:  "])) + line + draw(end)
        out += draw(end)
    if draw(st.booleans()):
        out = out[: draw(st.integers(0, len(out)))]  # the stream cut short
    return out


def cut(draw, stream: bytes) -> list[bytes]:
    points = sorted(set(draw(st.lists(st.integers(0, len(stream)), max_size=6))))
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


def play(reads: list[bytes], api: str, max_event_bytes: int, fast: bool) -> list:
    """What one path makes of the reads: each payload's outcome, then the answer (or where the bound refused)."""
    parser = SSEParser(max_event_bytes) if fast else ReferenceParser(max_event_bytes)
    reader = AnswerReader(api, AnswerLimits(max_tokens=4))
    outcomes: list = []
    for arrival, data in enumerate([*reads, None]):
        try:
            if data is None:
                got = parser.close_bytes() if fast else parser.close()
            else:
                got = parser.feed_bytes(data) if fast else parser.feed(data)
        except EventTooLarge:
            return [*outcomes, ("too large", arrival)]
        for payload in got:
            if is_done(payload) if fast else payload.strip() == "[DONE]":
                outcomes.append("done")
                continue
            failure = reader.take(payload, arrival)
            outcomes.append(failure)
            if failure is not None:
                return outcomes
    return [*outcomes, reader.finish(), reader.answer(0, 200, 1, None)]


@settings(max_examples=400, deadline=None)
@given(data=st.data(), api=st.sampled_from([API_COMPLETIONS, API_CHAT]), bound=st.sampled_from([1 << 20, 64]))
def test_the_fast_path_accepts_and_refuses_what_the_general_path_does(data, api, bound):
    reads = cut(data.draw, data.draw(streams()))
    assert play(reads, api, bound, fast=True) == play(reads, api, bound, fast=False)


@settings(max_examples=400, deadline=None)
@given(payload=payloads(), api=st.sampled_from([API_COMPLETIONS, API_CHAT]))
def test_one_payload_as_bytes_or_as_text_is_the_same_chunk_or_failure(payload, api):
    # A payload alone, so that each one is judged (in a stream, the first failure ends the request).
    text = payload.decode("utf-8", errors="replace")
    assert is_done(payload) == (text.strip() == "[DONE]")
    if not is_done(payload):
        limits = AnswerLimits(max_tokens=4)
        assert parse_payload(payload, api, limits) == parse_payload(text, api, limits)


def test_a_payload_is_done_as_its_text_stripped():
    for text in ("[DONE]", " [DONE]\t", "\u00a0[DONE]", "\x1c[DONE]\u2003", "[DONE]\n"):
        assert is_done(text.encode())
    for raw in (b"[DONE]x", b'{"a": "[DONE]"}', b"\xff[DONE]", b"[done]", b""):
        assert not is_done(raw)


def test_a_payload_refused_before_its_end_is_malformed_not_an_exception():
    # The decoder refuses `0` (not an object) or `usage` (not an object) before it sees the junk after them;
    # the refusal's value was then read with json.loads, which raised out of the client on the junk.
    for payload in ("0\x00", '{"usage": 3} x', "[1] ]"):
        for raw in (payload, payload.encode()):
            failure = parse_payload(raw, API_CHAT, AnswerLimits())
            assert str(failure) == f"malformed_sse: not one JSON value: {payload!r}"
