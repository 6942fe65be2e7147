"""Performance verdicts: every judged metric of one engine setting, from the two folders' repetitions, with a
bootstrap interval of the delta over resampled requests (and repetitions)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.measure import bootstrap
from kvbench.measure.run_folder import RunEntry, RunFolder
from kvbench.measure.schedule import is_closed_loop
from kvbench.verdicts.gate_metrics import PERF_METRICS, MetricSpec, PerfMetric, RequestSamples
from kvbench.verdicts.rates import RATE_METRICS, rate_interval, rate_mde
from kvbench.verdicts.verdict import CompareOptions, MetricComparison, Verdict, delta_of, judge, with_tolerance


@dataclass(frozen=True)
class SettingKey:
    """One engine setting at one workload and load point: a run id without its repetition."""

    engine: str
    kv_dtype: str
    workload: str
    load: str

    @property
    def label(self) -> str:
        return f"{self.engine}|{self.workload}|{self.load}"

    @classmethod
    def of(cls, entry: RunEntry) -> "SettingKey":
        return cls(entry.engine, str(entry.kv_dtype), entry.workload, entry.load)


@dataclass(frozen=True)
class Repetition:
    entry: RunEntry
    samples: RequestSamples | None  # None when requests.jsonl holds none of its records


def settings_of(folder: RunFolder) -> dict[SettingKey, tuple[Repetition, ...]]:
    """The folder's repetitions grouped by setting, in the order of summary.json."""
    settings: dict[SettingKey, list[Repetition]] = {}
    for entry in folder.entries:
        own = folder.records.get(entry.run_id)
        settings.setdefault(SettingKey.of(entry), []).append(
            Repetition(entry, RequestSamples.of(own, is_closed_loop(entry.load)) if own else None)
        )
    return {key: tuple(reps) for key, reps in settings.items()}


def _rng(options: CompareOptions, *stream: int) -> np.random.Generator:
    """A generator of its own for every (side, setting[, metric]): a row does not depend on the others."""
    return np.random.default_rng(np.random.SeedSequence([options.seed, *stream]))


@dataclass(frozen=True)
class _Side:
    """One folder's repetitions of a setting and, per repetition, its request resamples (None: no records)."""

    reps: Sequence[Repetition]
    counts: Sequence[np.ndarray | None]

    @classmethod
    def of(cls, reps: Sequence[Repetition], rng: np.random.Generator, resamples: int) -> "_Side":
        counts = [
            None
            if rep.samples is None or rep.samples.size == 0
            else bootstrap.resample_counts(rep.samples.size, resamples, rng)
            for rep in reps
        ]
        return cls(reps, counts)

    def values(self, metric: PerfMetric) -> list[float] | None:
        """The stored value of every repetition; None when a repetition lacks it."""
        values = [metric.stored(rep.entry.summary["overall"]) for rep in self.reps]
        return None if any(value is None for value in values) else [float(value) for value in values]

    def value(self, metric: PerfMetric) -> float | None:
        """The stored value, the mean over repetitions; None when a repetition lacks it."""
        values = self.values(metric)
        return None if values is None else float(np.mean(values))

    def replicates(self, metric: PerfMetric, rng: np.random.Generator) -> np.ndarray | None:
        if any(count is None for count in self.counts):
            return None
        per_rep = np.stack([metric.statistic(rep.samples, count) for rep, count in zip(self.reps, self.counts)])
        return bootstrap.mean_over_repetitions(per_rep, rng)


def compare_setting(
    key: SettingKey,
    index: int,
    base_reps: Sequence[Repetition],
    new_reps: Sequence[Repetition],
    options: CompareOptions,
) -> list[MetricComparison]:
    base = _Side.of(base_reps, _rng(options, 0, index), options.resamples)
    new = _Side.of(new_reps, _rng(options, 1, index), options.resamples)
    return [_compare_metric(key, index, PERF_METRICS[name], base, new, options) for name in options.metrics]


def _compare_metric(
    key: SettingKey, index: int, metric: PerfMetric, base_side: _Side, new_side: _Side, options: CompareOptions
) -> MetricComparison:
    spec = with_tolerance(metric.spec, options)
    base, new = base_side.value(metric), new_side.value(metric)

    def row(delta, ci, verdict, note="", mde=None):
        return MetricComparison(
            "perf",
            key.label,
            key.kv_dtype,
            spec.name,
            spec,
            base,
            new,
            delta,
            ci[0] if ci else None,
            ci[1] if ci else None,
            verdict,
            note,
            mde,
        )

    if base is None or new is None:
        sides = [side for side, value in (("baseline", base), ("new run", new)) if value is None]
        return row(None, None, Verdict.MISSING, f"not reported in the {' and the '.join(sides)}")
    delta = delta_of(spec, base, new)
    if spec.name in RATE_METRICS:  # per-repetition rates (rates.py says why), the request bootstrap below without
        interval = _repetition_interval(spec, metric, base_side, new_side, options)
        if interval is not None:
            ci = (interval.low, interval.high)
            reps = f"{len(base_side.reps)} + {len(new_side.reps)}"
            return row(
                delta, ci, judge(spec, delta, ci), f"from the {reps} repetitions' rates", rate_mde(spec, interval)
            )
    metric_index = list(PERF_METRICS).index(spec.name)
    base_boot = base_side.replicates(metric, _rng(options, 2, index, metric_index))
    new_boot = new_side.replicates(metric, _rng(options, 3, index, metric_index))
    if base_boot is None or new_boot is None:
        return row(
            delta, None, judge(spec, delta, None), "no per-request records: no CI, judged by the tolerance alone"
        )
    deltas = _deltas(spec, base_boot, new_boot)
    ci = bootstrap.percentile_interval(deltas, options.confidence)
    if ci is None:
        return row(
            delta,
            None,
            judge(spec, delta, None),
            "bootstrap degenerate (baseline near 0 or metric missing in resamples): judged by the tolerance alone",
        )
    mde = minimum_detectable_effect(spec, deltas, ci)
    spread = _repetition_interval(spec, metric, base_side, new_side, options)
    if spread is not None and spread.high - spread.low > ci[1] - ci[0]:
        # The repetitions disagree more than the requests do (a busy machine moves whole runs): the interval
        # holds that spread too, so run-to-run noise is not called a change.
        ci = (min(ci[0], spread.low), max(ci[1], spread.high))
        mde = max(mde, rate_mde(spec, spread))
        return row(delta, ci, judge(spec, delta, ci), "widened to the repetitions' spread", mde)
    return row(delta, ci, judge(spec, delta, ci), "", mde)


def _repetition_interval(spec, metric, base_side: _Side, new_side: _Side, options: CompareOptions):
    """The per-repetition interval (rates.py) of a relative metric, None with fewer than two repetitions a side."""
    if spec.scale != "relative":
        return None
    return rate_interval(base_side.values(metric) or [], new_side.values(metric) or [], options.confidence)


# One-sided normal quantile of the power a minimum detectable effect is stated for (80%).
_POWER_Z = 0.8416


def minimum_detectable_effect(spec: MetricSpec, deltas: np.ndarray, ci: tuple[float, float]) -> float:
    """The smallest true change (in the delta's unit, magnitude) that this run size calls a regression 4 times
    in 5: a regression needs the delta past the tolerance and the interval's near end past 0, i.e. a delta past
    max(tolerance, the interval's half width); a true change that far plus 0.84 standard deviations of the delta
    (its bootstrap spread) gets there with 80% probability. Bigger runs shrink it down to the tolerance."""
    half_width = (ci[1] - ci[0]) / 2.0
    spread = float(np.std(deltas[np.isfinite(deltas)]))
    return max(spec.tolerance, half_width) + _POWER_Z * spread


def _deltas(spec: MetricSpec, base_boot: np.ndarray, new_boot: np.ndarray) -> np.ndarray:
    """`delta_of` on every pair of replicates."""
    if spec.scale == "points":
        return new_boot - base_boot
    with np.errstate(divide="ignore", invalid="ignore"):
        return new_boot / base_boot - 1.0
