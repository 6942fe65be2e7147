"""Throughput verdicts from per-repetition rates: each repetition's stored rate (amount / its own duration) is one
observation, and the delta of the two sides' means gets a Student t interval on the ratio.

Why not resample requests: a run replays the same seeded workload in every repetition and every run (the same
sessions, prompts and answer lengths), so the request mix does not vary between runs and resampling it adds a
variance the runs never have; a throughput also hinges on the run's span, which a resample of requests can only
invent (completion spans gave +-60% at 100 requests; Little's law kept the span fixed but still carried the mix's
spread, and ignored how the in-flight count moves between runs). A repetition's rate holds exactly what moves a
run's throughput (the server's speed, the machine's load, the in-flight count the load reached), its interval
shrinks with the repetitions and with each repetition's length, and a slower server moves it one for one.
It needs three repetitions a side; with fewer the request bootstrap (gate_metrics.py) is the fallback.

The per-request metrics (TTFT, TPOT, ITL, E2E percentiles) keep the request bootstrap, but their interval is
widened to this one on their per-repetition values when the repetitions disagree more than the requests do:
on a busy machine whole runs move (the instrument's TTFT p50 of 40 ms read 43-60 ms under load 12), and a
request bootstrap alone called such identical pairs a TTFT change 8% of the time (benchmarks/gate_power.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.verdicts.gate_metrics import MetricSpec

RATE_METRICS = frozenset({"output_tok_s", "total_tok_s", "req_s"})  # judged from per-repetition rates
MIN_REPETITIONS = 3  # a side needs a spread it can be judged by (two a side: t(0.995, 2) = 9.9)


@dataclass(frozen=True)
class RateInterval:
    """The relative delta's interval from the repetitions' rates and its standard error (in the delta's unit)."""

    low: float
    high: float
    standard_error: float


def rate_interval(base: Sequence[float], new: Sequence[float], confidence: float) -> RateInterval | None:
    """Student's t interval of new_mean / base_mean - 1: each side's values relative to its mean, their variance
    pooled (runs of one design on one machine spread alike), nb + nn - 2 degrees of freedom, the delta method
    for the ratio. Welch's per-side degrees of freedom fell to ~1 when one side happened to agree closely
    (t(0.995, 1) = 64: a 5x TTFT went uncalled). None when a side has fewer than MIN_REPETITIONS values or a
    mean that is not positive."""
    from scipy.stats import t as student_t

    if len(base) < MIN_REPETITIONS or len(new) < MIN_REPETITIONS:
        return None
    mean_b, mean_n = sum(base) / len(base), sum(new) / len(new)
    if mean_b <= 0 or mean_n <= 0:
        return None
    dof = len(base) + len(new) - 2
    pooled = ((len(base) - 1) * _variance(base) / mean_b**2 + (len(new) - 1) * _variance(new) / mean_n**2) / dof
    ratio = mean_n / mean_b
    standard_error = ratio * math.sqrt(pooled * (1 / len(base) + 1 / len(new)))
    half = float(student_t.ppf(0.5 + confidence / 2, dof)) * standard_error
    return RateInterval(ratio - 1 - half, ratio - 1 + half, standard_error)


def rate_mde(spec: MetricSpec, interval: RateInterval) -> float:
    """As perf.minimum_detectable_effect: past max(tolerance, half width), plus 0.84 standard errors (80%)."""
    return max(spec.tolerance, (interval.high - interval.low) / 2) + 0.8416 * interval.standard_error


def _variance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((value - mean) ** 2 for value in values) / (len(values) - 1)
