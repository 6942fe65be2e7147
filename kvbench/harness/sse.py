"""The one Server-Sent Events parser kvbench uses, for every endpoint and every engine.

It follows the WHATWG event-stream rules that matter for OpenAI-style streams: lines end in LF, CRLF or CR;
`data:` lines of one event are joined with LF; a blank line dispatches the event; comment lines (`:`) and
other fields are ignored. The `[DONE]` sentinel is returned like any other payload; `is_done` says which it is.

Payloads stay bytes on the client's path (`feed_bytes`): the typed decoder reads UTF-8 bytes itself, so a
payload is never decoded to text only to be encoded again. `feed` gives the same payloads as text, invalid
UTF-8 replaced (decoding the joined bytes equals joining each line decoded: LF ends any UTF-8 sequence).
"""

from __future__ import annotations

import re

_LINE_END = re.compile(rb"\r\n|\r|\n")
_DATA = b"data: "
_DONE = b"[DONE]"
DEFAULT_MAX_EVENT_BYTES = 16 << 20


class EventTooLarge(ValueError):
    """One event (its unfinished line and data lines together) grew past the parser's bound."""


def is_done(payload: bytes) -> bool:
    """Whether a payload is the `[DONE]` sentinel: `[DONE]` within whitespace, as the text payload stripped."""
    return payload == _DONE or (_DONE in payload and payload.decode("utf-8", errors="replace").strip() == "[DONE]")


class SSEParser:
    """Incremental parser: feed bytes as they arrive, get complete `data` payloads back.

    State: the bytes of an unfinished line and the data lines of the event being read. Each byte is scanned
    once (an unfinished line grows in place, and only the new bytes are searched for a line end), so a feed
    costs time linear in its own bytes, whatever the size of the event they belong to. An event past
    `max_event_bytes` raises `EventTooLarge` naming the bound, before its bytes are kept.
    A CR that ends a chunk ends its line; an LF that starts the next chunk is then the rest of that CRLF.
    A chunk without CR (every OpenAI-style server's) is split on LF in one call, not matched line by line.
    """

    __slots__ = ("_partial", "_data", "_data_bytes", "_after_cr", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._partial = bytearray()
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._after_cr = False
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[str]:
        """Consume `chunk`; return the payloads of every event completed by it, in order, as text."""
        return [payload.decode("utf-8", errors="replace") for payload in self.feed_bytes(chunk)]

    def close(self) -> list[str]:
        """End of stream: a last line or event without its terminator is still delivered (as text)."""
        return [payload.decode("utf-8", errors="replace") for payload in self.close_bytes()]

    def feed_bytes(self, chunk: bytes) -> list[bytes]:
        """Consume `chunk`; return the payloads of every event completed by it, in order, as bytes."""
        events: list[bytes] = []
        if not chunk:
            return events
        if self._after_cr or b"\r" in chunk:
            self._feed_matched(chunk, events)
            return events
        lines = chunk.split(b"\n")
        rest = lines.pop()
        partial = self._partial
        for line in lines:
            if partial:
                self._check(len(partial) + len(line))
                partial += line
                line = bytes(partial)
                partial.clear()
            elif self._data_bytes + len(line) > self.max_event_bytes:
                self._check(len(line))
            if line.startswith(_DATA):
                value = line[6:]
                self._data.append(value)
                self._data_bytes += len(value) + 1
            else:
                self._line(line, events)
        if rest:
            self._check(len(partial) + len(rest))
            partial += rest
        return events

    def close_bytes(self) -> list[bytes]:
        """End of stream: a last line or event without its terminator is still delivered (as bytes)."""
        events: list[bytes] = []
        if self._partial:
            self._line(bytes(self._partial), events)
            self._partial.clear()
        if self._data:
            self._dispatch(events)
        return events

    def _feed_matched(self, chunk: bytes, events: list[bytes]) -> None:
        """A chunk with CRs (or after one): each line end matched, so CRLF, CR and LF all end a line."""
        position = 0
        if self._after_cr and chunk[:1] == b"\n":
            position = 1
        self._after_cr = False
        for match in _LINE_END.finditer(chunk, position):
            self._check(len(self._partial) + match.start() - position)
            if self._partial:
                self._partial += chunk[position : match.start()]
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = chunk[position : match.start()]
            self._line(line, events)
            position = match.end()
        if position < len(chunk):
            self._check(len(self._partial) + len(chunk) - position)
            self._partial += chunk[position:]
        elif chunk.endswith(b"\r"):
            self._after_cr = True

    def _check(self, line_bytes: int) -> None:
        """Refuse a line of `line_bytes` that would take the event being read past the bound."""
        if self._data_bytes + line_bytes > self.max_event_bytes:
            raise EventTooLarge(
                f"an SSE event is past {self.max_event_bytes:,} bytes "
                f"({self.max_event_bytes / 2**20:g} MiB, the client's max_event_bytes)"
            )

    def _dispatch(self, events: list[bytes]) -> None:
        data = self._data
        events.append(data[0] if len(data) == 1 else b"\n".join(data))
        self._data = []
        self._data_bytes = 0

    def _line(self, raw: bytes, events: list[bytes]) -> None:
        if not raw:
            if self._data:
                self._dispatch(events)
            return
        if raw[:1] == b":":
            return
        field, sep, value = raw.partition(b":")
        if field != b"data":
            return
        if sep and value[:1] == b" ":
            value = value[1:]
        self._data.append(value)
        self._data_bytes += len(value) + 1
