"""Token ids to streamed text: incremental detokenization and stop strings, in time linear in the output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class TextStream:
    """Turns a growing list of token ids into text deltas.

    Each token decodes only a short window (TGI's and vLLM's incremental detokenization): the tokens since
    `prefix_offset`, whose text up to `read_offset` was already emitted, so merged pieces and leading spaces
    come out as a whole decode would give them; decoding the whole output after every token made an
    8,000-token answer cost 32 million token decodes on the event loop. A trailing replacement character
    means an unfinished UTF-8 sequence: that text is held back until it completes. A stop string ends the
    text before it; it is searched for only where it could newly end (the last text's tail and the delta),
    so each token costs at most the stop strings' total length. `stopped` then says so and later tokens
    add nothing.
    """

    tokenizer: object
    stop: Sequence[str] = ()
    token_ids: list[int] = field(default_factory=list)
    stopped: bool = False
    prefix_offset: int = 0
    read_offset: int = 0
    _pieces: list[str] = field(default_factory=list)
    _tail: str = ""  # the last characters emitted, as many as the longest stop string could still need

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._pieces)

    def add(self, token_id: int) -> str:
        """Append a token; return the new text it completes (possibly empty)."""
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        window = self.token_ids[self.prefix_offset :]
        before = self._decode(window[: self.read_offset - self.prefix_offset])
        decoded = self._decode(window)
        if decoded.endswith("\ufffd") or len(decoded) <= len(before):
            return ""  # an unfinished character, or a token with no text yet: wait for more
        delta = decoded[len(before) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        delta = self._cut_at_stop(delta)
        self._pieces.append(delta)
        longest = max(map(len, self.stop), default=0)
        self._tail = (self._tail + delta)[-longest:] if longest > 1 else ""
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def _cut_at_stop(self, delta: str) -> str:
        """`delta` up to the earliest stop string that ends in it (setting `stopped`)."""
        searched, earliest = self._tail + delta, None
        for stop in self.stop:
            index = searched.find(stop, max(len(self._tail) - len(stop) + 1, 0))
            if stop and index != -1 and (earliest is None or index < earliest):
                earliest = index
        if earliest is None:
            return delta
        self.stopped = True
        cut = earliest - len(self._tail)
        if cut < 0:  # the stop began in text already sent: the answer's text ends before it all the same
            self._drop_last(-cut)
            return ""
        return delta[:cut]

    def _drop_last(self, n: int) -> None:
        text = self.text
        self._pieces = [text[: len(text) - n]]
