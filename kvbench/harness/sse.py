"""The one Server-Sent Events parser kvbench uses, for every endpoint and every engine.

It follows the WHATWG event-stream rules that matter for OpenAI-style streams: lines end in LF, CRLF or CR;
`data:` lines of one event are joined with LF; a blank line dispatches the event; comment lines (`:`) and
other fields are ignored. The `[DONE]` sentinel is returned like any other payload; the caller decides.
"""

from __future__ import annotations

import re

_LINE_END = re.compile(rb"\r\n|\r|\n")
DEFAULT_MAX_EVENT_BYTES = 16 << 20


class EventTooLarge(ValueError):
    """One event (its unfinished line and data lines together) grew past the parser's bound."""


class SSEParser:
    """Incremental parser: feed bytes as they arrive, get complete `data` payloads back.

    State: the bytes of an unfinished line and the data lines of the event being read. Each byte is scanned
    once (an unfinished line grows in place, and only the new bytes are searched for a line end), so a feed
    costs time linear in its own bytes, whatever the size of the event they belong to. An event past
    `max_event_bytes` raises `EventTooLarge` naming the bound, before its bytes are kept.
    A CR that ends a chunk ends its line; an LF that starts the next chunk is then the rest of that CRLF.
    """

    __slots__ = ("_partial", "_data", "_data_bytes", "_after_cr", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._partial = bytearray()
        self._data: list[str] = []
        self._data_bytes = 0
        self._after_cr = False
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[str]:
        """Consume `chunk`; return the payloads of every event completed by it, in order."""
        events: list[str] = []
        if not chunk:
            return events
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
        return events

    def close(self) -> list[str]:
        """End of stream: a last line or event without its terminator is still delivered."""
        events: list[str] = []
        if self._partial:
            self._line(bytes(self._partial), events)
            self._partial.clear()
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
            self._data_bytes = 0
        return events

    def _check(self, line_bytes: int) -> None:
        """Refuse a line of `line_bytes` that would take the event being read past the bound."""
        if self._data_bytes + line_bytes > self.max_event_bytes:
            raise EventTooLarge(
                f"an SSE event is past {self.max_event_bytes:,} bytes "
                f"({self.max_event_bytes / 2**20:g} MiB, the client's max_event_bytes)"
            )

    def _line(self, raw: bytes, events: list[str]) -> None:
        if not raw:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
                self._data_bytes = 0
            return
        if raw[:1] == b":":
            return
        field, sep, value = raw.partition(b":")
        if field != b"data":
            return
        if sep and value[:1] == b" ":
            value = value[1:]
        self._data.append(value.decode("utf-8", errors="replace"))
        self._data_bytes += len(value) + 1
