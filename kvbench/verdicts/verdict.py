"""A verdict on one metric: the options of a comparison, one row of it, and the rule that judges a delta with its
confidence interval against the metric's tolerance (shared by the performance and the quality verdicts)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from kvbench.verdicts.gate_metrics import DEFAULT_METRICS, PERF_METRICS, MetricSpec


class Verdict(str, Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_CHANGE = "no change"
    INCONCLUSIVE = "inconclusive"
    MISSING = "missing"


@dataclass(frozen=True)
class CompareOptions:
    """`tolerances` override the metrics' defaults, in the metric's delta unit (0.05 = 5% or 5 points)."""

    metrics: tuple[str, ...] = DEFAULT_METRICS
    tolerances: Mapping[str, float] = field(default_factory=dict)
    confidence: float = 0.99
    resamples: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [name for name in self.metrics if name not in PERF_METRICS]
        if unknown:
            raise ValueError(f"metrics: unknown {', '.join(unknown)}; valid: {', '.join(PERF_METRICS)}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence: {self.confidence} is not in [0.5, 1)")
        if self.resamples < 100:
            raise ValueError(f"resamples: {self.resamples} is too few for a confidence interval (use >= 100)")
        negative = [name for name, value in self.tolerances.items() if value < 0]
        if negative:
            raise ValueError(f"tolerances: negative for {', '.join(negative)}")


@dataclass(frozen=True)
class MetricComparison:
    """One row: a metric of one setting (or of one eval setting). `delta`, `ci_low`, `ci_high` and
    `tolerance` are in the spec's unit: a fraction for "relative", a difference of fractions for "points"."""

    kind: str  # "perf" | "quality"
    setting: str
    kv_dtype: str
    metric: str
    spec: MetricSpec | None
    baseline: float | None
    new: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: Verdict
    note: str = ""
    mde: float | None = None  # the smallest true change this run size detects 4 times in 5 (None: no CI)

    @property
    def one_sided(self) -> bool:
        """Present in exactly one folder: a mismatch (missing in both is just not measured)."""
        return self.verdict is Verdict.MISSING and (self.baseline is None) != (self.new is None)


def judge(spec: MetricSpec, delta: float | None, ci: tuple[float, float] | None) -> Verdict:
    """Regression: the CI lies wholly on the bad side of 0 and the delta exceeds the tolerance; improvement
    likewise on the good side; no change: the CI lies wholly within the tolerance; else inconclusive. Without
    a CI (quality evals, no per-request records) the tolerance alone decides.

    In "worse" units (positive = worse), tolerance t:

        -t         0         +t
         |---------|---------|        CI [lo, hi]
              [=======]               no change      (-t <= lo, hi <= t)
                     [=========]      inconclusive   (reaches past t, includes 0)
                        [======]      regression     (lo > 0 and delta > t)
    """
    if delta is None or math.isnan(delta):
        return Verdict.MISSING
    sign = 1.0 if spec.better == "lower" else -1.0  # worse > 0 after this sign
    worse = sign * delta
    worse_low, worse_high = sorted((sign * ci[0], sign * ci[1])) if ci is not None else (worse, worse)
    if worse > spec.tolerance and worse_low > 0:
        return Verdict.REGRESSION
    if -worse > spec.tolerance and worse_high < 0:
        return Verdict.IMPROVEMENT
    if -spec.tolerance <= worse_low and worse_high <= spec.tolerance or ci is None:
        return Verdict.NO_CHANGE
    return Verdict.INCONCLUSIVE


def delta_of(spec: MetricSpec, baseline: float, new: float) -> float:
    """new/baseline - 1 (relative; +-inf from a baseline of 0) or new - baseline (points)."""
    if spec.scale == "points":
        return new - baseline
    if baseline == 0:
        return 0.0 if new == 0 else math.copysign(math.inf, new)
    return new / baseline - 1.0


def with_tolerance(spec: MetricSpec, options: CompareOptions) -> MetricSpec:
    if spec.name in options.tolerances:
        return MetricSpec(spec.name, spec.better, spec.scale, options.tolerances[spec.name])
    return spec
