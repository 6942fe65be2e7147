"""The one Server-Sent Events parser kvbench uses, for every endpoint and every engine.

It follows the WHATWG event-stream rules that matter for OpenAI-style streams: lines end in LF, CRLF or CR;
`data:` lines of one event are joined with LF; a blank line dispatches the event; comment lines (`:`) and
other fields are ignored. The `[DONE]` sentinel is returned like any other payload; the caller decides.
"""

from __future__ import annotations

import re

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEParser:
    """Incremental parser: feed bytes as they arrive, get complete `data` payloads back.

    State: the bytes of an unfinished line and the data lines of the event being read. A trailing CR is held
    back until the next byte shows whether it is a CRLF.
    """

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Consume `chunk`; return the payloads of every event completed by it, in order."""
        events: list[str] = []
        buffer = self._buffer + chunk
        position = 0
        for match in _LINE_END.finditer(buffer):
            if match.group() == b"\r" and match.end() == len(buffer):
                break  # maybe the first half of a CRLF: wait for more bytes
            self._line(buffer[position : match.start()], events)
            position = match.end()
        self._buffer = buffer[position:]
        return events

    def close(self) -> list[str]:
        """End of stream: a last line or event without its terminator is still delivered."""
        events: list[str] = []
        if self._buffer:
            for line in _LINE_END.split(self._buffer):
                if line:
                    self._line(line, events)
            self._buffer = b""
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, raw: bytes, events: list[str]) -> None:
        if not raw:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)

