"""Paired statistics of a KV setting against the baseline on the same items: pure numpy/scipy, no torch.

Every item (a block of scored positions, a task document, a prompt) is scored under the baseline and under the
setting, so a delta is a difference of sums over the same items and its spread is the spread of per-item
differences, not of two independent samples. The interval is a percentile bootstrap over items (the harness's
resampling code, `kvbench.measure.bootstrap`: a resample is a row of counts, a ratio of sums a matrix product):

    delta = sum_i num_i / sum_i den_i          resampled as   counts @ num / counts @ den

Accuracy flips (item right under one side, wrong under the other) get McNemar's exact test: under "no
difference" the b flips right->wrong and c flips wrong->right are Binomial(b + c, 1/2). A difference of 0/1
outcomes (a task's documents) takes Bonett and Price's interval instead of the bootstrap, which has no width
when nothing flipped (`paired_binary_difference`).

A claim "the loss is under `claim`" is decided when the interval lies wholly on one side of -claim; an
interval that spans it and is wider than the claim reads "cannot resolve", so a small run never reads as
"no loss".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest, norm

from kvbench.measure.bootstrap import percentile_interval, ratio_of_sums, resample_counts

CONFIDENCE = 0.95
RESAMPLES = 2000
CLAIM_PCT = 0.5  # the article's "quality loss stays under 0.5%"
SEED = 0


@dataclass(frozen=True)
class PairedDelta:
    """A delta over `items` paired items with its bootstrap interval (None: too few items to resample)."""

    delta: float
    ci_low: float | None
    ci_high: float | None
    items: int

    @property
    def half_width(self) -> float | None:
        """Half the interval: the smallest change this run could tell from zero, roughly."""
        return None if self.ci_low is None or self.ci_high is None else (self.ci_high - self.ci_low) / 2.0

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.ci_low is not None and self.ci_high is not None and (self.ci_low > 0 or self.ci_high < 0)


def paired_ratio(
    numerator: np.ndarray,
    denominator: np.ndarray,
    *,
    transform=None,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> PairedDelta:
    """sum(numerator) / sum(denominator) over items (per-item arrays), optionally through `transform`
    (e.g. `lambda x: np.expm1(x)` for a relative perplexity change from a mean NLL difference), with a
    bootstrap interval over items. The numerator is already the paired difference where a delta is wanted."""
    numerator = np.asarray(numerator, dtype=float)
    denominator = np.asarray(denominator, dtype=float)
    if numerator.shape != denominator.shape or numerator.ndim != 1 or numerator.size == 0:
        raise ValueError(f"need two equal, non-empty 1-d arrays; got {numerator.shape} and {denominator.shape}")
    f = transform or (lambda x: x)
    point = float(f(numerator.sum() / denominator.sum()))
    if numerator.size < 2:
        return PairedDelta(point, None, None, int(numerator.size))
    counts = resample_counts(numerator.size, resamples, np.random.default_rng(seed))
    interval = percentile_interval(f(ratio_of_sums(numerator, denominator, counts)), confidence)
    low, high = interval if interval is not None else (None, None)
    return PairedDelta(point, low, high, int(numerator.size))


def paired_mean_difference(new: np.ndarray, base: np.ndarray, **options) -> PairedDelta:
    """mean(new - base) over paired items (scores, 0/1 correctness) with its bootstrap interval."""
    new, base = np.asarray(new, dtype=float), np.asarray(base, dtype=float)
    if new.shape != base.shape:
        raise ValueError(f"paired items must align: {new.shape} vs {base.shape}")
    return paired_ratio(new - base, np.ones_like(new), **options)


def paired_binary_difference(
    base_correct: np.ndarray, new_correct: np.ndarray, confidence: float = CONFIDENCE
) -> PairedDelta:
    """mean(new) - mean(base) over paired 0/1 outcomes, with Bonett & Price's (2012) adjusted Wald interval.

    The bootstrap of paired 0/1 items has no width when nothing flipped: 40 documents without a flip would read
    as a change of exactly zero, "no loss". This interval keeps the flips' sampling error: with `lost` (right ->
    wrong) and `gained` (wrong -> right) among n items, p_l = (lost + 1) / (n + 2), p_g = (gained + 1) / (n + 2),
    d = p_g - p_l and  d +- z * sqrt((p_g + p_l - d^2) / (n + 2)).  The point estimate is the plain difference."""
    base = np.asarray(base_correct, dtype=bool)
    new = np.asarray(new_correct, dtype=bool)
    if base.shape != new.shape or base.ndim != 1 or base.size == 0:
        raise ValueError(f"need two equal, non-empty 1-d arrays of outcomes; got {base.shape} and {new.shape}")
    n = base.size
    lost, gained = int((base & ~new).sum()), int((~base & new).sum())
    p_lost, p_gained = (lost + 1) / (n + 2), (gained + 1) / (n + 2)
    centre = p_gained - p_lost
    z = float(norm.ppf(0.5 + confidence / 2))
    half = z * math.sqrt((p_gained + p_lost - centre**2) / (n + 2))
    return PairedDelta((gained - lost) / n, max(centre - half, -1.0), min(centre + half, 1.0), n)


@dataclass(frozen=True)
class McNemar:
    """Flips of paired 0/1 outcomes: `lost` right under the baseline and wrong under the setting, `gained` the
    reverse; `p_value` is McNemar's exact two-sided test (1.0 without any flip)."""

    lost: int
    gained: int
    p_value: float


def mcnemar_exact(base_correct: np.ndarray, new_correct: np.ndarray) -> McNemar:
    base = np.asarray(base_correct, dtype=bool)
    new = np.asarray(new_correct, dtype=bool)
    if base.shape != new.shape:
        raise ValueError(f"paired outcomes must align: {base.shape} vs {new.shape}")
    lost, gained = int((base & ~new).sum()), int((~base & new).sum())
    flips = lost + gained
    p_value = 1.0 if flips == 0 else float(binomtest(min(lost, gained), flips, 0.5).pvalue)
    return McNemar(lost, gained, min(p_value, 1.0))


def proportion_ci(successes: int, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Clopper-Pearson (exact) interval of a rate; None without trials."""
    if trials <= 0:
        return None
    interval = binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="exact")
    return float(interval.low), float(interval.high)


def verdict(delta_pct: PairedDelta, claim_pct: float = CLAIM_PCT) -> str:
    """What a signed delta in % (negative = a loss) says about "the loss is under `claim_pct`%".

    An interval wholly above -claim shows the loss is under it; wholly below, that it is over it (however wide
    the interval). An interval that spans -claim cannot decide; when it is also wider than the claim itself
    (half-width > claim) the run "cannot resolve" a loss of that size at all."""
    half = delta_pct.half_width
    if half is None or not math.isfinite(half):
        return "cannot resolve (too few items)"
    if delta_pct.ci_low >= -claim_pct:
        return f"loss < {claim_pct:g}%"
    if delta_pct.ci_high < -claim_pct:
        return f"loss > {claim_pct:g}%"
    if half > claim_pct:
        return f"cannot resolve (CI half-width {half:.2f}% > {claim_pct:g}%)"
    return f"undecided at {claim_pct:g}% (CI spans it)"
