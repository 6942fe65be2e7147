"""The metrics `kvbench compare` judges: for each, which direction is better, its tolerance, its stored value
in summary.json and the same metric on resampled requests.

Every per-request quantity comes from `measure/metrics.py` (`RequestSamples`), so a resampled metric is the
summary's own definition; only the aggregation is vectorised (`bootstrap.py`), and without resampling it
reproduces the stored value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.measure import bootstrap, metrics
from kvbench.measure.records import RequestRecord
from kvbench.verdicts.directions import higher_is_better


@dataclass(frozen=True)
class MetricSpec:
    """How a metric is judged: which direction is better, how its delta is expressed, and its tolerance.

    `scale` is "relative" (delta = new / baseline - 1) or "points" (delta = new - baseline, for fractions);
    `tolerance` is in the same unit as the delta (0.05 = 5% relative, or 5 percentage points).
    """

    name: str
    better: str  # "lower" | "higher"
    scale: str  # "relative" | "points"
    tolerance: float

    def __post_init__(self) -> None:
        if self.better not in ("lower", "higher") or self.scale not in ("relative", "points"):
            raise ValueError(f"{self.name}: better must be lower|higher and scale relative|points")


@dataclass(frozen=True)
class RequestSamples:
    """Per-request quantities of one repetition's `metrics.completed` requests, as columns (NaN = not reported)."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    itl_ms: np.ndarray  # every inter-token gap, pooled
    itl_owner: np.ndarray  # index of the request each gap belongs to
    output_tokens: np.ndarray
    total_tokens: np.ndarray
    counts_for_cache: np.ndarray  # bool
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    reusable_tokens: np.ndarray
    recomputed_tokens: np.ndarray
    span_s: np.ndarray  # metrics.completion_spans_s: they sum to the duration
    closed_loop: bool = False  # a concurrency's load: throughput by Little's law (see _per_second)

    @property
    def size(self) -> int:
        return int(self.output_tokens.size)

    @classmethod
    def of(cls, records: Sequence[RequestRecord], closed_loop: bool = False) -> "RequestSamples":
        ok = metrics.completed(records)

        def column(value: Callable[[RequestRecord], float | None]) -> np.ndarray:
            return np.array([np.nan if (v := value(record)) is None else v for record in ok], dtype=np.float64)

        gaps = [metrics.itl_ms(record) for record in ok]
        return cls(
            ttft_ms=column(metrics.ttft_ms),
            tpot_ms=column(metrics.tpot_ms),
            e2e_ms=column(metrics.e2e_ms),
            itl_ms=np.array([gap for request in gaps for gap in request], dtype=np.float64),
            itl_owner=np.array([index for index, request in enumerate(gaps) for _ in request], dtype=np.int64),
            output_tokens=column(lambda record: metrics.output_token_count(record) or 0),
            total_tokens=column(metrics.total_token_count),
            counts_for_cache=np.array([metrics.counts_for_cache(record) for record in ok], dtype=bool),
            prompt_tokens=column(lambda record: record.prompt_tokens),
            cached_tokens=column(lambda record: record.cached_tokens),
            reusable_tokens=column(lambda record: record.reusable_tokens),
            recomputed_tokens=column(metrics.recomputed_tokens),
            span_s=np.array(metrics.completion_spans_s(ok), dtype=np.float64),
            closed_loop=closed_loop,
        )


Statistic = Callable[[RequestSamples, np.ndarray], np.ndarray]  # (samples, counts B x n) -> B values


def _percentile_of(column: str, q: float) -> Statistic:
    return lambda samples, counts: bootstrap.percentile(getattr(samples, column), counts, q)


def _itl_percentile(q: float) -> Statistic:
    return lambda samples, counts: bootstrap.pooled_percentile(samples.itl_ms, samples.itl_owner, counts, q)


def _per_second(column: Callable[[RequestSamples], np.ndarray]) -> Statistic:
    """A throughput on resampled requests; unresampled, exactly the stored sum(amount) / duration.

    Closed loop (a concurrency): Little's law, (requests in flight on average over the run) x (amount per
    second of a request's own E2E), the second a ratio of sums over requests and the first held at the run's.
    The load sets the in-flight count; what the server changes is a request's tokens per second of its E2E,
    and that ratio's interval shrinks as 1/sqrt(requests). Resampling completion spans instead (the gap since
    the previous completion, which swings from 0 to a whole E2E) gave resamples durations the run never had:
    +-60% at 100 requests however steady the server. Run-to-run spread of the in-flight count enters through
    the repetitions, which are resampled too.

    Open loop (a rate or a trace): the arrivals set the duration, so their noise is the throughput's; the
    completion spans (close to the inter-arrival gaps) are resampled with the amounts."""

    def statistic(samples: RequestSamples, counts: np.ndarray) -> np.ndarray:
        if not samples.closed_loop:
            return bootstrap.ratio_of_sums(column(samples), samples.span_s, counts)
        e2e_s = samples.e2e_ms / 1000.0
        timed = ~np.isnan(e2e_s)
        duration_s = float(samples.span_s.sum())
        if duration_s <= 0 or not timed.any():
            return np.full(counts.shape[0], np.nan)
        in_flight = float(e2e_s[timed].sum()) / duration_s
        return in_flight * bootstrap.ratio_of_sums(column(samples)[timed], e2e_s[timed], counts[:, timed])

    return statistic


def _cache_rate(numerator: str, denominator: str) -> Statistic:
    def statistic(samples: RequestSamples, counts: np.ndarray) -> np.ndarray:
        counted = samples.counts_for_cache
        top = getattr(samples, numerator)[counted]
        if np.isnan(top).any():  # as metrics.cache_accounting: one request without cached_tokens, no rate
            return np.full(counts.shape[0], np.nan)
        return bootstrap.ratio_of_sums(top, getattr(samples, denominator)[counted], counts[:, counted])

    return statistic


@dataclass(frozen=True)
class PerfMetric:
    """A metric of `summary.json` (`stored`) and the same metric on resampled requests (`statistic`)."""

    spec: MetricSpec
    stored: Callable[[Mapping], float | None]  # from a summary's "overall" group
    statistic: Statistic


def _stat(metric: str, stat: str) -> Callable[[Mapping], float | None]:
    return lambda overall: (overall.get(metric) or {}).get(stat)


def _perf_metrics() -> dict[str, PerfMetric]:
    lower, higher = "lower", "higher"
    rel, points = "relative", "points"
    table = [
        ("ttft_p50", lower, rel, 0.05, _stat("ttft_ms", "p50"), _percentile_of("ttft_ms", 50)),
        ("ttft_p90", lower, rel, 0.10, _stat("ttft_ms", "p90"), _percentile_of("ttft_ms", 90)),
        ("ttft_p99", lower, rel, 0.10, _stat("ttft_ms", "p99"), _percentile_of("ttft_ms", 99)),
        ("itl_p50", lower, rel, 0.05, _stat("itl_ms", "p50"), _itl_percentile(50)),
        ("itl_p99", lower, rel, 0.10, _stat("itl_ms", "p99"), _itl_percentile(99)),
        ("tpot_p50", lower, rel, 0.05, _stat("tpot_ms", "p50"), _percentile_of("tpot_ms", 50)),
        ("e2e_p50", lower, rel, 0.05, _stat("e2e_ms", "p50"), _percentile_of("e2e_ms", 50)),
        ("e2e_p99", lower, rel, 0.10, _stat("e2e_ms", "p99"), _percentile_of("e2e_ms", 99)),
        ("output_tok_s", higher, rel, 0.05, lambda o: o.get("output_tok_s"), _per_second(lambda s: s.output_tokens)),
        ("total_tok_s", higher, rel, 0.05, lambda o: o.get("total_tok_s"), _per_second(lambda s: s.total_tokens)),
        ("req_s", higher, rel, 0.05, lambda o: o.get("req_s"), _per_second(lambda s: np.ones(s.size))),
        (
            "cache_hit_rate",
            higher,
            points,
            0.02,
            lambda o: o["cache"].get("cache_hit_rate"),
            _cache_rate("cached_tokens", "prompt_tokens"),
        ),
        (
            "prefill_recompute_rate",
            lower,
            points,
            0.02,
            lambda o: o["cache"].get("prefill_recompute_rate"),
            _cache_rate("recomputed_tokens", "reusable_tokens"),
        ),
    ]
    return {
        name: PerfMetric(MetricSpec(name, better, scale, tol), stored, stat)
        for name, better, scale, tol, stored, stat in table
    }


PERF_METRICS: Mapping[str, PerfMetric] = _perf_metrics()
DEFAULT_METRICS = (
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "tpot_p50",
    "e2e_p50",
    "output_tok_s",
    "cache_hit_rate",
    "prefill_recompute_rate",
)

# Quality metrics of eval.json: the direction from the metric's source (verdicts/directions.py), never its name.
_QUALITY_TOLERANCES = {"kl": ("relative", 0.10), "top1_agreement": ("points", 0.005)}


def quality_spec(name: str, recorded: Mapping[str, bool] | None = None) -> MetricSpec | None:
    """kl: 10% relative; top1_agreement: 0.5 points; any other metric 1% relative (the article's bar is <0.5%
    aggregate loss, so 1% on one task is already worth a look). None when no source declares its direction
    (`recorded`: the directions eval.json holds)."""
    better = higher_is_better(name, recorded)
    if better is None:
        return None
    scale, tolerance = _QUALITY_TOLERANCES.get(name, ("relative", 0.01))
    return MetricSpec(name, "higher" if better else "lower", scale, tolerance)
