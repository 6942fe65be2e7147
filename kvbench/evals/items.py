"""Direct measures as paired items: blocks of scored positions, overall and per context-position bucket.

Neighbouring positions of one text are not independent (they share the context and the topic), so the item of
the bootstrap is a block of `block` consecutive positions of one window, not a position:

    window 0:  [pos 0 .. 127][128 .. 255] ...      window 1:  [0 .. 127] ...      -> items 0, 1, ..., n
    bucket [512, 1024) of every window -> blocks of that range only

Signed deltas in % (negative = worse), each a ratio of per-item sums (so `paired.paired_ratio` resamples it):

    perplexity       base_ppl / ppl - 1    = expm1(-sum(nll - base_nll) / sum(positions))
    top1_agreement   agreement - 1         = sum(match - 1) / sum(positions)   (the baseline agrees with itself)
    next_token_acc   acc / base_acc - 1    = sum(correct - base_correct) / sum(base_correct), McNemar on flips
    kl               no baseline value (it is 0 there): the interval is of KL itself, in nats
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.evals.divergence import PositionScores
from kvbench.evals.paired import McNemar, PairedDelta, mcnemar_exact, paired_ratio

DEFAULT_BLOCK = 128
# Context-position bucket edges (tokens already seen); the last edge is the model's window at most.
BUCKET_EDGES = (0, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Items:
    """Per-item sums (aligned 1-d arrays, one entry per block) and every position's 0/1 outcomes."""

    positions: np.ndarray
    kl: np.ndarray
    nll: np.ndarray  # of the true next token under the setting
    base_nll: np.ndarray  # the same under the baseline
    matches: np.ndarray
    correct: np.ndarray
    base_correct: np.ndarray
    flips_base: np.ndarray  # per position (McNemar): baseline right
    flips_new: np.ndarray  # per position: setting right

    @property
    def count(self) -> int:
        return int(self.positions.size)


def make_items(
    scores: Sequence[PositionScores], block: int = DEFAULT_BLOCK, low: int = 0, high: int | None = None
) -> Items:
    """Blocks of `block` positions of every window, keeping positions in [low, high) only."""
    sums: list[list[float]] = [[] for _ in range(7)]
    flips_base, flips_new = [], []
    for window in scores:
        keep = (window.position >= low) & (window.position < (high if high is not None else np.inf))
        index = np.flatnonzero(keep)
        for start in range(0, index.size, block):
            part = index[start : start + block]
            for column, values in zip(
                sums,
                (
                    np.ones(part.size),
                    window.kl[part],
                    window.nll[part],
                    window.base_nll[part],
                    window.top1_match[part],
                    window.correct[part],
                    window.base_correct[part],
                ),
            ):
                column.append(float(np.sum(values)))
        flips_base.append(window.base_correct[index])
        flips_new.append(window.correct[index])
    arrays = [np.asarray(column, dtype=float) for column in sums]
    concat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=bool)  # noqa: E731
    return Items(*arrays, concat(flips_base), concat(flips_new))


@dataclass(frozen=True)
class DirectMetric:
    """One direct measure of one setting: its value, the baseline's, the signed delta % with its interval
    (`interval_of` "kl" for KL, whose interval is of the value), McNemar where outcomes flip."""

    name: str
    value: float
    baseline: float | None
    delta: PairedDelta
    interval_of: str  # "delta_pct" or "value"
    mcnemar: McNemar | None = None


def direct_metrics(items: Items) -> list[DirectMetric]:
    """KL, top-1 agreement, perplexity and next-token accuracy of one setting over `items` (see module doc)."""
    if items.count == 0:
        return []
    n = items.positions.sum()
    nll_diff = items.nll - items.base_nll
    base_acc = items.base_correct.sum() / n
    out = [
        DirectMetric("kl", float(items.kl.sum() / n), 0.0, paired_ratio(items.kl, items.positions), "value"),
        DirectMetric(
            "top1_agreement",
            float(items.matches.sum() / n),
            1.0,
            paired_ratio(items.matches - items.positions, items.positions, transform=_pct),
            "delta_pct",
        ),
        DirectMetric(
            "perplexity",
            float(np.exp(items.nll.sum() / n)),
            float(np.exp(items.base_nll.sum() / n)),
            paired_ratio(nll_diff, items.positions, transform=lambda x: 100.0 * np.expm1(-x)),
            "delta_pct",
        ),
    ]
    if items.base_correct.sum() > 0:
        out.append(
            DirectMetric(
                "next_token_acc",
                float(items.correct.sum() / n),
                float(base_acc),
                paired_ratio(items.correct - items.base_correct, items.base_correct, transform=_pct),
                "delta_pct",
                mcnemar_exact(items.flips_base, items.flips_new),
            )
        )
    return out


def _pct(x):
    return 100.0 * x


def buckets(window: int, edges: Sequence[int] = BUCKET_EDGES) -> list[tuple[int, int]]:
    """The buckets [low, high) that positions 0..window-2 fall in (the last one cut at the window)."""
    out = []
    for low, high in zip(edges, edges[1:]):
        if low >= window - 1:
            break
        out.append((low, min(high, window - 1)))
    return out
