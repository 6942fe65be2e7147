"""Noise-aware comparison of a run folder against a baseline run folder: the nightly regression gate.

For every engine setting (engine label, kv_dtype, workload, load point: a run id without its repetition) and
metric: the baseline and new values, the delta, a bootstrap confidence interval of the delta, and a verdict.

    regression    the whole CI of the delta lies on the bad side of 0  AND  the delta exceeds the tolerance
    improvement   the same, on the good side
    no change     the whole CI lies within the tolerance on both sides: any change is smaller than it
    inconclusive  neither: the CI reaches past the tolerance and does not exclude the other side (too few
                  requests, too much noise), or the metric's direction is unknown; `--strict` fails on it
    missing       a value (or a whole setting) exists in only one folder, or in neither

Without a CI (quality evals, no per-request records) the tolerance alone decides between the first three.
Deltas are relative (`+20%`) for times and throughputs, and in percentage points for rates that are already
fractions (cache hit rate, prefill recompute rate), which also keeps a baseline of 0 meaningful.

The CI comes from resampling requests: each repetition's per-request quantities (`gate_metrics.RequestSamples`,
taken with the per-request functions of `metrics.py`) are resampled with replacement `resamples` times with a
fixed seed, and each metric is recomputed on every resample at once (`bootstrap.py`). With several
repetitions the repetitions are resampled too (a two-level bootstrap), so run-to-run spread widens the
interval. The point values are the stored `summary.json` values (the mean over repetitions).

Pure: the folders come in read (`run_folder.read_run_folder`); nothing here prints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from kvbench.harness import config_schema
from kvbench.measure import bootstrap
from kvbench.verdicts.gate_metrics import DEFAULT_METRICS, PERF_METRICS, MetricSpec, PerfMetric, RequestSamples, quality_spec
from kvbench.measure.run_folder import CONFIG_YAML, EVAL_JSON, SUMMARY_MD, RunEntry, RunFolder

# config.yaml sections that must agree for two runs to be comparable (engines and workloads are checked per
# setting, where a difference is attributed to the setting it belongs to).
_CONFIG_SECTIONS = ("seed", "repeat", "stop", "client", "slo")


class Verdict(str, Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_CHANGE = "no change"
    INCONCLUSIVE = "inconclusive"
    MISSING = "missing"


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


def _settings(folder: RunFolder) -> dict[SettingKey, tuple[Repetition, ...]]:
    """The folder's repetitions grouped by setting, in the order of summary.json."""
    settings: dict[SettingKey, list[Repetition]] = {}
    for entry in folder.entries:
        own = folder.records.get(entry.run_id)
        settings.setdefault(SettingKey.of(entry), []).append(Repetition(entry, RequestSamples.of(own) if own else None))
    return {key: tuple(reps) for key, reps in settings.items()}


# --- comparison --------------------------------------------------------------------------------------------


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

    @property
    def one_sided(self) -> bool:
        """Present in exactly one folder: a mismatch (missing in both is just not measured)."""
        return self.verdict is Verdict.MISSING and (self.baseline is None) != (self.new is None)


@dataclass(frozen=True)
class Comparison:
    baseline_dir: str
    new_dir: str
    options: CompareOptions
    rows: tuple[MetricComparison, ...]
    mismatches: tuple[str, ...]  # the two folders do not measure the same thing
    notes: tuple[str, ...]  # worth knowing, not a mismatch

    @property
    def regressions(self) -> tuple[MetricComparison, ...]:
        return tuple(row for row in self.rows if row.verdict is Verdict.REGRESSION)

    @property
    def improvements(self) -> tuple[MetricComparison, ...]:
        return tuple(row for row in self.rows if row.verdict is Verdict.IMPROVEMENT)

    @property
    def inconclusive(self) -> tuple[MetricComparison, ...]:
        return tuple(row for row in self.rows if row.verdict is Verdict.INCONCLUSIVE)

    @property
    def mismatched(self) -> bool:
        return bool(self.mismatches) or any(row.one_sided for row in self.rows)

    def exit_code(self, strict: bool = False, allow_inconclusive: bool = False) -> int:
        """1 on any regression (or, when strict, any mismatch or inconclusive metric, unless inconclusive ones
        are allowed: a gate that cannot power every metric still refuses mismatches and regressions), else 0."""
        unresolved = bool(self.inconclusive) and not allow_inconclusive
        return 1 if self.regressions or (strict and (self.mismatched or unresolved)) else 0


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


def compare(baseline: RunFolder, new: RunFolder, options: CompareOptions = CompareOptions()) -> Comparison:
    """Compare every setting and metric of `new` against `baseline` (see the module docstring)."""
    mismatches, notes = _config_mismatches(baseline.config, new.config)
    notes += _env_notes(baseline.env, new.env)
    rows: list[MetricComparison] = []
    base_settings, new_settings = _settings(baseline), _settings(new)
    keys = list(base_settings) + [key for key in new_settings if key not in base_settings]
    for index, key in enumerate(keys):
        base_reps, new_reps = base_settings.get(key), new_settings.get(key)
        if base_reps is None or new_reps is None:
            where = "baseline" if new_reps is None else "new run"
            hint = "did it fail to start or was it removed?" if new_reps is None else "promote a new baseline"
            rows.append(MetricComparison("perf", key.label, key.kv_dtype, "all", None, None, None, None, None, None,
                                         Verdict.MISSING, f"setting only in the {where} ({hint})"))
            mismatches.append(f"{key.label} [{key.kv_dtype}]: only in the {where}")
            continue
        mismatches += [f"{key.label} [{key.kv_dtype}]: {text}" for text in _setting_mismatches(base_reps, new_reps)]
        notes += [f"{key.label} [{key.kv_dtype}]: {text}" for text in _validity_notes(base_reps, new_reps)]
        rows += _compare_setting(key, index, base_reps, new_reps, options)
    eval_rows, eval_mismatches = _compare_evals(baseline, new, options)
    rows += eval_rows
    mismatches += eval_mismatches
    return Comparison(str(baseline.path), str(new.path), options, tuple(rows), tuple(mismatches), tuple(notes))


def _spec(spec: MetricSpec, options: CompareOptions) -> MetricSpec:
    if spec.name in options.tolerances:
        return MetricSpec(spec.name, spec.better, spec.scale, options.tolerances[spec.name])
    return spec


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
        counts = [None if rep.samples is None or rep.samples.size == 0 else
                  bootstrap.resample_counts(rep.samples.size, resamples, rng) for rep in reps]
        return cls(reps, counts)

    def value(self, metric: PerfMetric) -> float | None:
        """The stored value, the mean over repetitions; None when a repetition lacks it."""
        values = [metric.stored(rep.entry.summary["overall"]) for rep in self.reps]
        return None if any(value is None for value in values) else float(np.mean(values))

    def replicates(self, metric: PerfMetric, rng: np.random.Generator) -> np.ndarray | None:
        if any(count is None for count in self.counts):
            return None
        per_rep = np.stack([metric.statistic(rep.samples, count) for rep, count in zip(self.reps, self.counts)])
        return bootstrap.mean_over_repetitions(per_rep, rng)


def _compare_setting(key: SettingKey, index: int, base_reps: Sequence[Repetition], new_reps: Sequence[Repetition],
                     options: CompareOptions) -> list[MetricComparison]:
    base = _Side.of(base_reps, _rng(options, 0, index), options.resamples)
    new = _Side.of(new_reps, _rng(options, 1, index), options.resamples)
    return [_compare_metric(key, index, PERF_METRICS[name], base, new, options) for name in options.metrics]


def _compare_metric(key: SettingKey, index: int, metric: PerfMetric, base_side: _Side, new_side: _Side,
                    options: CompareOptions) -> MetricComparison:
    spec = _spec(metric.spec, options)
    base, new = base_side.value(metric), new_side.value(metric)

    def row(delta, ci, verdict, note=""):
        return MetricComparison("perf", key.label, key.kv_dtype, spec.name, spec, base, new, delta,
                                ci[0] if ci else None, ci[1] if ci else None, verdict, note)

    if base is None or new is None:
        sides = [side for side, value in (("baseline", base), ("new run", new)) if value is None]
        return row(None, None, Verdict.MISSING, f"not reported in the {' and the '.join(sides)}")
    delta = delta_of(spec, base, new)
    metric_index = list(PERF_METRICS).index(spec.name)
    base_boot = base_side.replicates(metric, _rng(options, 2, index, metric_index))
    new_boot = new_side.replicates(metric, _rng(options, 3, index, metric_index))
    if base_boot is None or new_boot is None:
        return row(delta, None, judge(spec, delta, None), "no per-request records: no CI, judged by the tolerance alone")
    ci = bootstrap.percentile_interval(_deltas(spec, base_boot, new_boot), options.confidence)
    note = "" if ci else "bootstrap degenerate (baseline near 0 or metric missing in resamples): judged by the tolerance alone"
    return row(delta, ci, judge(spec, delta, ci), note)


def _deltas(spec: MetricSpec, base_boot: np.ndarray, new_boot: np.ndarray) -> np.ndarray:
    """`delta_of` on every pair of replicates."""
    if spec.scale == "points":
        return new_boot - base_boot
    with np.errstate(divide="ignore", invalid="ignore"):
        return new_boot / base_boot - 1.0


def _compare_evals(baseline_folder: RunFolder, new_folder: RunFolder,
                   options: CompareOptions) -> tuple[list[MetricComparison], list[str]]:
    """Rows for every eval setting and metric, and a mismatch when only one folder has an eval.json."""
    baseline, new = baseline_folder.evals, new_folder.evals
    if baseline is None and new is None:
        return [], []
    if baseline is None or new is None:
        return [], [f"{EVAL_JSON} only in the {'baseline' if new is None else 'new run'}: quality not compared"]
    rows = []
    for setting in list(baseline) + [name for name in new if name not in baseline]:
        base_metrics, new_metrics = baseline.get(setting), new.get(setting)
        if base_metrics is None or new_metrics is None:
            where = "baseline" if new_metrics is None else "new run"
            rows.append(MetricComparison("quality", setting, setting, "all", None, None, None, None, None, None,
                                         Verdict.MISSING, f"eval setting only in the {where}"))
            continue
        # The new run's recorded directions first (its lm-eval said so), then the baseline's.
        recorded = {**baseline_folder.eval_directions.get(setting, {}), **new_folder.eval_directions.get(setting, {})}
        rows += [_compare_quality(setting, name, base_metrics.get(name), new_metrics.get(name), recorded, options)
                 for name in list(base_metrics) + [name for name in new_metrics if name not in base_metrics]]
    return rows, []


def _compare_quality(setting: str, name: str, base: float | None, value: float | None, recorded: Mapping[str, bool],
                     options: CompareOptions) -> MetricComparison:
    spec = quality_spec(name, recorded)
    if spec is None:
        return MetricComparison("quality", setting, setting, name, None, base, value, None, None, None,
                                Verdict.INCONCLUSIVE, "direction unknown: neither lm-eval's higher_is_better nor "
                                "kvbench's table (verdicts/directions.py) declares it")
    spec = _spec(spec, options)
    if base is None or value is None:
        sides = [side for side, item in (("baseline", base), ("new run", value)) if item is None]
        return MetricComparison("quality", setting, setting, name, spec, base, value, None, None, None,
                                Verdict.MISSING, f"not reported in the {' and the '.join(sides)}")
    delta = delta_of(spec, base, value)
    return MetricComparison("quality", setting, setting, name, spec, base, value, delta, None, None,
                            judge(spec, delta, None), "deterministic eval: judged by the tolerance")


def _differences(base: Mapping, new: Mapping, prefix: str = "") -> list[str]:
    out = []
    for key in list(base) + [key for key in new if key not in base]:
        a, b = base.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def _config_mismatches(base: Mapping, new: Mapping) -> tuple[list[str], list[str]]:
    """Differences of the compared config sections, each side read as today's schema (config_schema.current:
    keys added since a side was written count as their defaults); and notes on what was filled."""
    if not base or not new:
        return ([] if not base and not new else [f"{CONFIG_YAML} only in the {'baseline' if base else 'new run'}"]), []
    read = []
    for side, config in (("baseline", base), ("new run", new)):
        try:
            read.append(config_schema.current(config))
        except ValueError as exc:
            return [f"{side} {CONFIG_YAML}: {exc}"], []
    notes = [f"{side} {CONFIG_YAML} is schema version {item.version}: read with today's defaults for "
             + ", ".join(item.filled) for side, item in zip(("baseline", "new run"), read)
             if item.filled and read[0].version != read[1].version]
    diffs = _differences(*({key: item.config.get(key) for key in _CONFIG_SECTIONS} for item in read))
    return [f"{CONFIG_YAML} differs: {diff}" for diff in diffs], notes


def _setting_mismatches(base_reps: Sequence[Repetition], new_reps: Sequence[Repetition]) -> list[str]:
    out = []
    base, new = base_reps[0].entry, new_reps[0].entry
    out += [f"workload params differ: {diff}" for diff in _differences(base.workload_params, new.workload_params)]
    out += [f"engine settings differ: {diff}" for diff in _differences(base.engine_settings, new.engine_settings)]
    if len(base_reps) != len(new_reps):
        out.append(f"repetitions differ: {len(base_reps)} -> {len(new_reps)}")
    return out


def _validity_notes(base_reps: Sequence[Repetition], new_reps: Sequence[Repetition]) -> list[str]:
    out = []
    for side, reps in (("baseline", base_reps), ("new run", new_reps)):
        for rep in reps:
            if not rep.entry.valid:
                reason = "; ".join(rep.entry.invalid_reasons) or f"see {SUMMARY_MD}"
                out.append(f"{side} repetition r{rep.entry.repeat} is marked invalid ({reason})")
    return out


def _env_notes(base: Mapping, new: Mapping) -> list[str]:
    out = []
    for key in ("cpu", "gpu", "cpu_count"):
        if base.get(key) != new.get(key) and base and new:
            out.append(f"measured on different machines: {key} {base.get(key)!r} -> {new.get(key)!r}")
    return out
