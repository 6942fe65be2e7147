"""Bootstrap statistics on per-request columns, all resamples at once: pure numpy, nothing of kvbench.

A resample of n requests is a row of counts (how often each request was drawn, summing to n), so B resamples
are a B x n integer matrix and a statistic maps (columns, counts) to B values: a weighted percentile is
exactly `np.percentile` of the repeated sample, a ratio of sums is a matrix product. With several repetitions
the repetitions are resampled too (`mean_over_repetitions`), so run-to-run spread widens the interval.
"""

from __future__ import annotations

import numpy as np

from kvbench.distribution import PERCENTILE_METHOD

assert PERCENTILE_METHOD == "linear", "the weighted percentile below reproduces numpy's linear method only"


def resample_counts(size: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`resamples` draws of `size` requests with replacement, as counts (resamples x size, int32)."""
    return rng.multinomial(size, np.full(size, 1.0 / size), size=resamples).astype(np.int32)


def weighted_percentile(sorted_values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of integer `weights` (B x G, aligned with ascending `sorted_values`), the q-th percentile of the
    sample that repeats `sorted_values[i]` `weights[b, i]` times: exactly `np.percentile(..., method="linear")`.
    NaN for an empty row. Rows are processed in blocks to bound memory for large G (pooled ITL gaps)."""
    rows = weights.shape[0]
    out = np.full(rows, np.nan)
    if sorted_values.size == 0:
        return out
    block = max(1, 4_000_000 // sorted_values.size)
    for start in range(0, rows, block):
        # int32 halves the memory traffic of the dominant step; a row's total is at most requests x gaps.
        cumulative = np.cumsum(weights[start : start + block], axis=1, dtype=np.int32)
        total = cumulative[:, -1]
        position = q / 100.0 * np.maximum(total - 1, 0)
        low = np.floor(position)
        # The element of rank r (0-based) is the first whose cumulative count exceeds r.
        low_rank = low.astype(np.int32)
        high_rank = np.minimum(low_rank + 1, np.maximum(total - 1, 0)).astype(np.int32)
        low_index = (cumulative <= low_rank[:, None]).sum(axis=1)
        high_index = (cumulative <= high_rank[:, None]).sum(axis=1)
        last = sorted_values.size - 1
        low_value = sorted_values[np.minimum(low_index, last)]
        high_value = sorted_values[np.minimum(high_index, last)]
        values = low_value + (position - low) * (high_value - low_value)
        out[start : start + block] = np.where(total > 0, values, np.nan)
    return out


def percentile(values: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """The q-th percentile of one value per request (NaN: the request has none) in every resample."""
    present = np.flatnonzero(~np.isnan(values))
    order = present[np.argsort(values[present], kind="stable")]
    return weighted_percentile(values[order], counts[:, order], q)


def pooled_percentile(values: np.ndarray, owner: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """The q-th percentile of values pooled over requests (`owner[i]`: the request of `values[i]`): a resampled
    request brings all its values, as many times as it was drawn."""
    order = np.argsort(values, kind="stable")
    return weighted_percentile(values[order], counts[:, owner[order]], q)


def ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """sum(numerator) / sum(denominator) over every resample; NaN where the denominator's sum is not > 0."""
    top, bottom = counts @ numerator, counts @ denominator
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1), np.nan)


def mean_over_repetitions(per_repetition: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Replicates of the mean over k repetitions from each one's B request resamples (k x B): repetitions drawn
    with replacement, and within each drawn repetition one of its resamples (a different one for every slot)."""
    k, resamples = per_repetition.shape
    if k == 1:
        return per_repetition[0]
    chosen = rng.integers(0, k, size=(resamples, k))
    columns = (np.arange(resamples)[:, None] + np.arange(k)[None, :] * max(1, resamples // k)) % resamples
    return per_repetition[chosen, columns].mean(axis=1)


def percentile_interval(replicates: np.ndarray, confidence: float) -> tuple[float, float] | None:
    """The central `confidence` interval of the finite replicates; None when over 1% of them are not finite."""
    finite = replicates[np.isfinite(replicates)]
    if finite.size < 0.99 * replicates.size:
        return None
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return float(low), float(high)
