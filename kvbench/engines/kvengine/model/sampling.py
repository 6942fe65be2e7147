"""Choosing next tokens from logits, and log-probabilities of chosen tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing logits by 1e-40 overflows to inf and
# the softmax to NaN, which torch.multinomial refuses.
GREEDY_BELOW_TEMPERATURE = 1e-5
# What torch.Generator.manual_seed accepts is wider; this is vLLM's range (a 64-bit signed integer).
SEED_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling: a temperature below GREEDY_BELOW_TEMPERATURE (0 included) is greedy; `seed`
    makes a request reproducible on its own."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature={self.temperature} must be a finite number >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:  # NaN fails this too
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed={self.seed} must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A fresh generator for this request (keep it for the request's life), or None: torch's default."""
        return None if self.seed is None else torch.Generator(device=device).manual_seed(self.seed)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """Next token id per row of `logits [B, V]`; row i uses params[i] and generators[i].

    Vectorised over rows: greedy rows take the argmax; the others are softmaxed at their own temperature,
    cut to their own top-p nucleus and sampled by inverse CDF (the first token whose cumulative probability
    exceeds u * total) with one uniform u per row, all in batched ops. The only per-row step is drawing u from
    a seeded row's own generator (a request's seed must give the same tokens whatever its neighbours; vLLM
    loops over seeded requests the same way); unseeded rows share one draw from torch's default generator.
    """
    if not (len(params) == len(generators) == logits.shape[0]):
        raise ValueError(f"logits has {logits.shape[0]} rows but {len(params)} params and {len(generators)} generators")
    logits = logits.float()
    out = logits.argmax(-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    device = logits.device
    index = torch.tensor(rows, device=device)
    temperature = torch.tensor([params[i].temperature for i in rows], device=device)[:, None]
    probs = torch.softmax(logits[index] / temperature, dim=-1)
    top_p = [params[i].top_p for i in rows]
    if min(top_p) < 1:
        probs = _top_p(probs, torch.tensor(top_p, device=device)[:, None])
    out[index] = _inverse_cdf(probs, _uniforms([generators[i] for i in rows], device))
    return out


def _uniforms(generators: Sequence[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One U[0, 1) draw per row: seeded rows from their generator, the rest in one draw."""
    u = torch.empty(len(generators), device=device)
    unseeded = [j for j, gen in enumerate(generators) if gen is None]
    if unseeded:
        u[torch.tensor(unseeded, device=device)] = torch.rand(len(unseeded), device=device)
    for j, gen in enumerate(generators):
        if gen is not None:
            u[j] = torch.rand((), generator=gen, device=gen.device)
    return u


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of `probs [B, V]` (rows need not sum to 1): the first token whose cumulative mass exceeds
    u * total; never a zero-probability token (the last kept token when rounding pushes u * total past)."""
    cdf = probs.cumsum(-1)
    chosen = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)[:, 0]
    last_kept = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(-1)
    return torch.minimum(chosen, last_kept)


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row, keep the smallest set of most likely tokens whose mass reaches the row's top_p [B, 1]
    (always at least one); a row with top_p 1 keeps every token."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probabilities (of the raw logits, temperature not applied) of chosen tokens and of the top k."""

    token_ids: torch.Tensor  # [n]
    logprobs: torch.Tensor  # [n]
    top_ids: torch.Tensor  # [n, k]
    top_logprobs: torch.Tensor  # [n, k]


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_k: int = 0) -> TokenLogprobs:
    """Logprob of `token_ids[i]` under `logits[i]`, plus the `top_k` most likely tokens per row."""
    if token_ids.shape != logits.shape[:1]:
        raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}; logits have {logits.shape[0]} rows")
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(-1, token_ids[:, None].to(logp.device))[:, 0]
    top = logp.topk(top_k, dim=-1)
    return TokenLogprobs(token_ids, chosen, top.indices, top.values)
