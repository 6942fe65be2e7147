"""A local Hugging Face tokenizer as the load generator's text codec (re-tokenizing answers, chat prompts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HFCodec:
    tokenizer: object

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)


def load_codec(path: str) -> HFCodec:
    """The tokenizer in a local folder (a model folder or a saved tokenizer); never a hub download."""
    from transformers import AutoTokenizer

    return HFCodec(AutoTokenizer.from_pretrained(path, local_files_only=True))
