"""Deterministic synthetic token ids: which ids are safe to send, and keyed pseudo-random streams of them.

Two ways to draw ids, both reproducible from a seed:
- the generator uses numpy `Generator`s seeded from `SeedSequence([seed, stream, ...])`, so each piece of
  content (a tenant's system prompt, a corpus document, a session) has its own stream and does not move when
  another piece is added (e.g. the corpus stays the same when the session count changes);
- trace readers and placeholder answers use `keyed_tokens`, a counter-based hash (SplitMix64 of key + position)
  that is vectorized over many keys at once: equal keys give equal tokens, which is how a Mooncake block hash
  maps to a fixed block of token ids without a per-block generator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from kvbench.workloads.spec import TOKEN_DTYPE, WorkloadError

DEFAULT_VOCAB_SIZE = 32000
# The most tokens any one length of a workload or trace may ask for (a prompt part, an output, a document):
# past any model's context window, and a typo such as 3000000000 would otherwise allocate gigabytes of ids.
MAX_TOKENS_PER_FIELD = 1 << 24
# Byte-level and sentencepiece vocabularies keep special/control/byte tokens at the lowest ids (Llama-2,
# Mistral, SmolLM) or the highest ones (Llama-3 reserves 256, Qwen about 300 past its BPE merges), so both
# ends are avoided; with the default vocabulary of 32000 the ids are valid for any model of >= 32K vocab.
_LOW_MARGIN = 1000
_HIGH_MARGIN = 1024


@dataclass(frozen=True)
class TokenRange:
    """Half-open range [low, high) of token ids that synthetic prompts are drawn from."""

    low: int
    high: int

    @property
    def span(self) -> int:
        return self.high - self.low


def safe_token_range(vocab_size: int) -> TokenRange:
    """The ids to draw from for a model of `vocab_size` ids: the vocabulary minus margins at both ends."""
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise WorkloadError(f"vocab_size must be an int >= 256 (the model's vocabulary size), got {vocab_size!r}")
    low = min(_LOW_MARGIN, vocab_size // 8)
    high = vocab_size - min(_HIGH_MARGIN, vocab_size // 8)
    return TokenRange(low, high)


def stable_key(*parts: object) -> int:
    """A 64-bit key from strings and ints that is the same in every process (unlike `hash()` of a str)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over a uint64 array (wrapping arithmetic is intended)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keyed_tokens(keys: np.ndarray | int, length: int, token_range: TokenRange) -> np.ndarray:
    """For each key, `length` pseudo-random ids in `token_range`; shape (len(keys), length), or (length,).

    Token j of key k depends only on (k, j), so a shorter length gives a prefix of a longer one.
    """
    scalar = np.ndim(keys) == 0
    key_array = np.atleast_1d(np.asarray(keys, dtype=np.uint64))
    mixed_keys = _splitmix64(key_array)[:, None]
    counters = _splitmix64(mixed_keys + np.arange(length, dtype=np.uint64)[None, :])
    # Multiply-shift maps the high 32 bits onto the span without a modulo (bias < span / 2**32).
    ids = ((counters >> np.uint64(32)) * np.uint64(token_range.span)) >> np.uint64(32)
    tokens = (ids.astype(np.int64) + token_range.low).astype(TOKEN_DTYPE)
    return tokens[0] if scalar else tokens
