"""Divergence of another engine's KV setting from its baseline, from the prompt logprobs the engine returns.

vLLM's /v1/completions takes `prompt_logprobs: k` and answers, for every prompt position after the first, the top-k
tokens' logprobs plus the prompt token's own: `{"<id>": {"logprob": -1.2, "rank": 1, "decoded_token": "a"}, ...}`
(the first position is `null`). Per position, against the baseline's answer for the same window:

    KL          divergence.topk_kl over the baseline's top-k plus a "rest" bucket (approximate)
    top-1       the rank-1 tokens agree
    perplexity  from the prompt token's own logprob (exact: the engine always returns it)

No greedy generations here: that comparison stays in-process (our engine).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvbench.engines.base import EngineError
from kvbench.engines.http import request
from kvbench.evals.divergence import EMPTY, DivergenceStats, topk_kl

TOP_K = 20  # vLLM's default --max-logprobs
METHOD = f"approximate (top-{TOP_K} prompt logprobs over HTTP, the engine's own KV setting)"


@dataclass(frozen=True)
class PromptLogprobs:
    """One window's answer: `top[i]` the top-k {token id: logprob} and `own[i]` the logprob of the prompt token,
    for positions 1..n-1 of `tokens`."""

    tokens: tuple[int, ...]
    top: tuple[Mapping[int, float], ...]
    own: tuple[float, ...]


def parse_prompt_logprobs(tokens: Sequence[int], answer: Mapping, top_k: int = TOP_K) -> PromptLogprobs:
    """A /v1/completions answer with `prompt_logprobs` as PromptLogprobs (raises EngineError when it has none)."""
    try:
        positions = answer["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise EngineError(
            "the engine's answer has no choices[0].prompt_logprobs (does it support prompt_logprobs?)"
        ) from None
    if positions is None or len(positions) != len(tokens):
        raise EngineError(
            f"prompt_logprobs: expected {len(tokens)} positions, got {None if positions is None else len(positions)}"
        )
    top, own = [], []
    for token, entries in zip(tokens[1:], positions[1:]):
        parsed = {int(key): value for key, value in entries.items()}
        top.append({key: value["logprob"] for key, value in parsed.items() if value.get("rank", 1) <= top_k})
        own.append(parsed[int(token)]["logprob"])
    return PromptLogprobs(tuple(tokens), tuple(top), tuple(own))


def fetch_prompt_logprobs(
    base_url: str, model: str, tokens: Sequence[int], top_k: int = TOP_K, api_key: str | None = None
) -> PromptLogprobs:
    body = {"model": model, "prompt": list(tokens), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top_k}
    reply = request("POST", f"{base_url}/v1/completions", timeout_s=600, api_key=api_key, json_body=body)
    if not reply.ok:
        raise EngineError(
            f"prompt logprobs request failed: {reply.error or ''} HTTP {reply.status} {reply.body[:300]!r}"
        )
    return parse_prompt_logprobs(tokens, json.loads(reply.body), top_k)


def compare_prompt_logprobs(
    base: Sequence[PromptLogprobs], new: Sequence[PromptLogprobs], vocab_size: int
) -> DivergenceStats:
    """Divergence of `new` from `base`, window by window (the same windows, in order)."""
    total = EMPTY
    for reference, other in zip(base, new, strict=True):
        if reference.tokens != other.tokens:
            raise ValueError("prompt logprobs of different windows cannot be compared")
        kl = sum(topk_kl(b, n, vocab_size) for b, n in zip(reference.top, other.top))
        top1 = sum(max(b, key=b.get) == max(n, key=n.get) for b, n in zip(reference.top, other.top))
        total = total + DivergenceStats(len(reference.own), kl, top1, -sum(other.own), -sum(reference.own))
    return total
