"""What the runtime is asked for and what it answers, one token at a time."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbench.engines.kvengine.core.prefix_index import DEVICE_TIER
from kvbench.engines.kvengine.model.sampling import SamplingParams, TokenLogprobs, token_logprobs


@dataclass(frozen=True)
class GenerationRequest:
    """One generation. `logprobs`/`prompt_logprobs` are top-k counts (None: not wanted; 0: chosen token only).

    `ignore_eos` generates exactly `max_tokens` (benchmarks); `stop_token_ids` end it early otherwise, as do
    the model's own EOS tokens. Stop strings are the server's business (it calls `abort(..., "stop")`).
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams(temperature=0.0)
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    tenant: str = "default"


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one engine can serve: its context, its device tier's pages and its vocabulary. The server checks
    every request against them once, at its boundary (`check`); the engine then trusts its typed requests."""

    max_model_len: int
    page_size: int
    device_pages: int
    vocab_size: int

    def check(self, request: GenerationRequest) -> None:
        """Raise ValueError (with the field and the fix) for a request the engine cannot serve."""
        if not request.prompt_ids:
            raise ValueError("prompt: empty; send at least one token")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {request.max_tokens}")
        total = len(request.prompt_ids) + request.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt ({len(request.prompt_ids)} tokens) + max_tokens ({request.max_tokens}) = {total} exceeds "
                f"the model's context of {self.max_model_len} tokens; shorten the prompt or lower max_tokens"
            )
        pages = -(-total // self.page_size)
        if pages > self.device_pages:
            raise ValueError(
                f"the request needs {pages} KV pages but the device tier holds {self.device_pages}; "
                "raise kv_capacity or shorten the request"
            )
        bad = next((token for token in request.prompt_ids if not 0 <= token < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt: token id {bad} is outside the vocabulary [0, {self.vocab_size})")


@dataclass(frozen=True)
class TokenLogprob:
    """A token's logprob and the top alternatives as (token id, logprob), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def of(cls, result: TokenLogprobs, row: int, top_k: int | None) -> TokenLogprob:
        """Row `row` of the model's logprobs, with its `top_k` alternatives."""
        top = ()
        if top_k:
            ids = result.top_ids[row, :top_k].tolist()
            values = result.top_logprobs[row, :top_k].tolist()
            top = tuple(zip((int(i) for i in ids), (float(v) for v in values)))
        return cls(int(result.token_ids[row]), float(result.logprobs[row]), top)


@dataclass(frozen=True)
class StepOutput:
    """One event of a request: a new token, and/or the end (then `finish_reason` is set).

    `prompt_logprobs` arrives with the first token when asked for: entry i is the logprob of prompt token
    i+1 given tokens 0..i (the first prompt token has none).
    """

    request_id: str
    token_id: int | None
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_by_tier: dict[str, int] | None = None  # where the cached tokens came from (device, host, ...)
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class LiveRequest:
    """The runtime's state of a request in flight: its tokens so far and its sampler."""

    request: GenerationRequest
    generator: object
    tokens: list[int]
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    cached_tokens: int | None = None
    cached_tokens_by_tier: dict[str, int] | None = None
    page_tiers: tuple[str, ...] = ()  # tier each cached prompt page came from at admission

    def count_cached(self, num_cached_tokens: int, page_size: int) -> None:
        """At its first step: the prefix-cache hits, per tier the cached pages came from, in prompt order."""
        if self.cached_tokens is not None:
            return
        self.cached_tokens = num_cached_tokens
        self.cached_tokens_by_tier = {}
        for i in range(num_cached_tokens // page_size):
            tier = self.page_tiers[i] if i < len(self.page_tiers) else DEVICE_TIER
            self.cached_tokens_by_tier[tier] = self.cached_tokens_by_tier.get(tier, 0) + page_size

    def collect_prompt_logprobs(self, start: int, end: int, rows: torch.Tensor) -> None:
        """Logprob of prompt token p+1 from the logits at position p, for the prompt positions among the
        computed tokens [start, end) whose logits are `rows`."""
        first = max(start, len(self.prompt_logprobs))  # a recomputed chunk (after preemption) adds none
        last = min(end, len(self.request.prompt_ids) - 1)  # positions p with a next prompt token
        if last <= first:
            return
        count, offset = last - first, first - start
        targets = torch.tensor(self.tokens[first + 1 : last + 1], device=rows.device)
        top_k = self.request.prompt_logprobs
        result = token_logprobs(rows[offset : offset + count], targets, top_k=top_k or 0)
        self.prompt_logprobs.extend(TokenLogprob.of(result, row, top_k) for row in range(count))

    def take_prompt_logprobs(self) -> tuple[TokenLogprob, ...] | None:
        """The prompt logprobs, once (with the first token), when they were asked for."""
        if self.request.prompt_logprobs is None or self.prompt_logprobs_sent:
            return None
        self.prompt_logprobs_sent = True
        return tuple(self.prompt_logprobs)
