"""A tiny random-weight model with a real byte-level tokenizer and chat template, for fast engine tests.

Token ids 0..255 are bytes; 256 is `<|endoftext|>` (EOS), 257 `<|im_start|>`, 258 `<|im_end|>`; the model's
vocabulary is 512, so ids above 258 exist but never decode to text.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvbench.engines.kvengine.model.loader import LoadedModel
from kvbench.engines.kvengine.model.parallel import SINGLE, TensorParallel
from kvbench.engines.kvengine.model.tiny import TINY_CONFIG, tiny_model

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EOS_ID = 256


def byte_tokenizer():
    """A transformers fast tokenizer over raw bytes (no merges), built in memory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = _byte_alphabet()
    vocab = {alphabet[byte]: byte for byte in range(256)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens(
        {"eos_token": "<|endoftext|>", "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer and decoder assume."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    extra = iter(range(256, 512))
    return {byte: chr(byte if byte in printable else next(extra)) for byte in range(256)}


def tiny_loaded_model(
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    parallel: TensorParallel = SINGLE,
) -> LoadedModel:
    """The tiny model on `device` in `dtype` (this rank's shard of it with several ranks)."""
    return LoadedModel(
        model=tiny_model(seed, device=device, dtype=dtype, parallel=parallel),
        tokenizer=byte_tokenizer(),
        config=TINY_CONFIG,
        eos_token_ids=frozenset({EOS_ID}),
        folder=Path("tiny-random"),
    )
