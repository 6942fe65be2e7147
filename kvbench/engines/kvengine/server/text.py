"""Token ids to streamed text: incremental detokenization and stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class TextStream:
    """Turns a growing list of token ids into text deltas.

    Decoding the whole output each time keeps multi-byte characters and merged pieces right; a trailing
    replacement character means an unfinished UTF-8 sequence, so that text is held back until it completes.
    A stop string ends the text before it; `stopped` then says so and later tokens add nothing.
    """

    tokenizer: object
    stop: Sequence[str] = ()
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stopped: bool = False

    def add(self, token_id: int) -> str:
        """Append a token; return the new text it completes (possibly empty)."""
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        decoded = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if decoded.endswith("\ufffd"):
            return ""
        for stop in self.stop:
            index = decoded.find(stop, max(len(self.text) - len(stop), 0))
            if stop and index != -1:
                decoded = decoded[:index]
                self.stopped = True
                break
        if not decoded.startswith(self.text):
            # A later token re-segmented earlier text; emit nothing rather than rewrite what was sent.
            return ""
        delta = decoded[len(self.text) :]
        self.text = decoded
        return delta
