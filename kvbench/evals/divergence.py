"""How far a quantized-KV model's outputs drift from the unquantized one's: pure measures on logits and tokens.

exact (full vocabulary, in-process):   KL(P_base || P_kv) per position, summed in nats
approximate (top-k logprobs, HTTP):    KL over the baseline's top-k tokens plus one "rest" bucket; a token
                                       missing from the other side's top-k gets that side's rest mass spread
                                       over the vocabulary's remaining tokens (a lower bound on its logprob
                                       would overstate KL; this is the even-spread guess)
top-1 agreement:                       argmax equal at a position
perplexity:                            exp(mean NLL of the true next token) under the KV setting
greedy generations:                    exact-match rate of whole generations, first divergent position
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DivergenceStats:
    """Sums over scored positions (so windows and documents merge by adding)."""

    positions: int
    kl_sum: float  # nats
    top1_matches: int
    nll_sum: float  # of the true next token under the measured setting
    base_nll_sum: float  # the same under the baseline

    @property
    def kl(self) -> float:
        return self.kl_sum / self.positions

    @property
    def top1_agreement(self) -> float:
        return self.top1_matches / self.positions

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_sum / self.positions)

    @property
    def perplexity_delta(self) -> float:
        """Relative perplexity change against the baseline on the same positions (0.01 = +1%)."""
        return math.exp((self.nll_sum - self.base_nll_sum) / self.positions) - 1.0

    def __add__(self, other: DivergenceStats) -> DivergenceStats:
        return DivergenceStats(
            self.positions + other.positions,
            self.kl_sum + other.kl_sum,
            self.top1_matches + other.top1_matches,
            self.nll_sum + other.nll_sum,
            self.base_nll_sum + other.base_nll_sum,
        )


EMPTY = DivergenceStats(0, 0.0, 0, 0.0, 0.0)


@dataclass(frozen=True)
class PositionScores:
    """Per-position measures of one window (numpy arrays of equal length; `position[i]` is the index in the
    window of the token whose next token is scored, so 0 has seen one token). What items, position buckets
    and paired intervals are made of; `stats` is their sum."""

    position: np.ndarray  # int
    kl: np.ndarray  # nats
    nll: np.ndarray  # of the true next token under the measured setting
    base_nll: np.ndarray  # the same under the baseline
    top1_match: np.ndarray  # bool: argmax equal to the baseline's
    correct: np.ndarray  # bool: argmax is the true next token, under the measured setting
    base_correct: np.ndarray  # the same under the baseline

    @property
    def stats(self) -> DivergenceStats:
        return DivergenceStats(
            int(self.position.size),
            float(self.kl.sum()),
            int(self.top1_match.sum()),
            float(self.nll.sum()),
            float(self.base_nll.sum()),
        )


@dataclass(frozen=True)
class Reference:
    """The baseline's side of a comparison, computed once per window and reused for every setting."""

    log_probs: torch.Tensor  # [n, vocab] float64
    probs: torch.Tensor
    top: torch.Tensor  # [n] argmax
    targets: torch.Tensor  # [n] the true next tokens
    nll: np.ndarray

    @classmethod
    def of(cls, base: torch.Tensor, targets: torch.Tensor) -> Reference:
        if base.shape[0] != targets.shape[0]:
            raise ValueError(f"logits {tuple(base.shape)} and targets {tuple(targets.shape)} must align")
        log_probs = torch.log_softmax(base.double(), dim=-1)
        rows = torch.arange(targets.shape[0])
        return cls(log_probs, log_probs.exp(), base.argmax(-1), targets, (-log_probs[rows, targets]).numpy())


def compare_positions(
    base: torch.Tensor | Reference, new: torch.Tensor, targets: torch.Tensor | None = None
) -> PositionScores:
    """Exact per-position measures from full logits `[n, vocab]`; `targets [n]` are the true next tokens
    (or `base` is a `Reference` that holds them)."""
    ref = base if isinstance(base, Reference) else Reference.of(base, targets)
    if ref.log_probs.shape != new.shape:
        raise ValueError(
            f"logits {tuple(ref.log_probs.shape)} vs {tuple(new.shape)} and targets "
            f"{tuple(ref.targets.shape)} must align"
        )
    new_lp = torch.log_softmax(new.double(), dim=-1)
    kl = (ref.probs * (ref.log_probs - new_lp)).sum(-1).clamp_min(0.0)  # rounding can make an exact 0 slightly < 0
    rows = torch.arange(ref.targets.shape[0])
    new_top = new.argmax(-1)
    return PositionScores(
        position=np.arange(int(ref.targets.shape[0])),
        kl=kl.numpy(),
        nll=(-new_lp[rows, ref.targets]).numpy(),
        base_nll=ref.nll,
        top1_match=(ref.top == new_top).numpy(),
        correct=(new_top == ref.targets).numpy(),
        base_correct=(ref.top == ref.targets).numpy(),
    )


def compare_logits(base: torch.Tensor, new: torch.Tensor, targets: torch.Tensor) -> DivergenceStats:
    """Exact measures from full logits `[n, vocab]` of the same positions; `targets [n]` are the true next tokens."""
    return compare_positions(base, new, targets).stats


def topk_kl(base_top: Mapping[int, float], new_top: Mapping[int, float], vocab_size: int) -> float:
    """Approximate KL(base || new) from two top-k logprob maps of one position (see the module docstring)."""
    base_rest = max(1.0 - sum(math.exp(lp) for lp in base_top.values()), 0.0)
    new_rest = max(1.0 - sum(math.exp(lp) for lp in new_top.values()), 1e-12)
    unseen = max(vocab_size - len(new_top), 1)
    kl = 0.0
    covered_new = 0.0
    for token, lp in base_top.items():
        q_lp = new_top.get(token, math.log(new_rest / unseen))
        covered_new += math.exp(q_lp)
        kl += math.exp(lp) * (lp - q_lp)
    rest_q = max(1.0 - covered_new, 1e-12)
    if base_rest > 0:
        kl += base_rest * math.log(base_rest / rest_q)
    return max(kl, 0.0)


@dataclass(frozen=True)
class GreedyStats:
    """Greedy generations of one setting against the baseline's, prompt by prompt.

    `first_divergence[i]` is the index of the first differing generated token, None when the two agree over
    the whole shorter generation (an identical generation has no divergence: missing, not 0).
    """

    prompts: int
    exact_matches: int
    first_divergence: tuple[int | None, ...]
    tokens_compared: int
    tokens_matching_prefix: int

    @property
    def exact_match_rate(self) -> float:
        return self.exact_matches / self.prompts

    @property
    def mean_first_divergence(self) -> float | None:
        """Mean first divergent position over the generations that diverged; None when none did."""
        values = [value for value in self.first_divergence if value is not None]
        return sum(values) / len(values) if values else None

    @property
    def matching_prefix_rate(self) -> float:
        """Share of generated tokens that precede the first divergence (1.0 when all generations agree)."""
        return self.tokens_matching_prefix / self.tokens_compared if self.tokens_compared else 1.0


def compare_generations(base: Sequence[Sequence[int]], new: Sequence[Sequence[int]]) -> GreedyStats:
    """Exact match and first divergence of `new[i]` against `base[i]`."""
    if len(base) != len(new) or not base:
        raise ValueError(f"need the same, non-zero number of generations; got {len(base)} and {len(new)}")
    firsts: list[int | None] = []
    matches = compared = prefix = 0
    for reference, other in zip(base, new):
        length = min(len(reference), len(other))
        first = next((i for i in range(length) if reference[i] != other[i]), None)
        matches += list(reference) == list(other)
        firsts.append(first)
        compared += len(reference)
        prefix += (
            len(reference)
            if first is None and len(reference) == len(other)
            else (first if first is not None else length)
        )
    return GreedyStats(len(base), matches, tuple(firsts), compared, prefix)
