"""What the runtime is asked for and what it answers, one token at a time."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.engines.kvengine.model.sampling import SamplingParams


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


@dataclass(frozen=True)
class TokenLogprob:
    """A token's logprob and the top alternatives as (token id, logprob), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


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
