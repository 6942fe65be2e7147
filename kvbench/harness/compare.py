"""Noise-aware comparison of a run folder against a baseline run folder: the nightly regression gate.

For every engine setting (engine label, kv_dtype, workload, load point: a run id without its repetition) and
metric: the baseline and new values, the delta, a bootstrap confidence interval of the delta, and a verdict.

    regression   the whole CI of the delta lies on the bad side of 0  AND  the delta exceeds the tolerance
    improvement  the same, on the good side
    no change    otherwise (noise, or a real change smaller than the tolerance)
    missing      a value (or a whole setting) exists in only one folder, or in neither

Deltas are relative (`+20%`) for times and throughputs, and in percentage points for rates that are already
fractions (cache hit rate, prefill recompute rate), which also keeps a baseline of 0 meaningful.

The CI comes from resampling requests: each repetition's per-request quantities (taken with the per-request
functions of `metrics.py`) are resampled with replacement `resamples` times with a fixed seed, and each
metric is recomputed on every resample at once with numpy (a weighted percentile is exactly
`np.percentile` of the repeated sample; throughput is a ratio of token sums to the time between completions).
With several repetitions the repetitions are resampled too (a two-level bootstrap), so run-to-run spread
widens the interval. The point values are the stored `summary.json` values (the mean over repetitions).

Pure apart from `read_run_folder`, which reads files: nothing here prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np
import yaml

from kvbench.distribution import PERCENTILE_METHOD
from kvbench.measure.metrics import NS_PER_S, e2e_ms, itl_ms, output_token_count, tpot_ms, ttft_ms
from kvbench.measure.records import RequestRecord, read_records
from kvbench.measure.report import REQUESTS_JSONL, SUMMARY_JSON

EVAL_JSON = "eval.json"
CONFIG_YAML = "config.yaml"
ENV_JSON = "env.json"
# config.yaml sections that must agree for two runs to be comparable (engines and workloads are checked per
# setting, where a difference is attributed to the setting it belongs to).
_CONFIG_SECTIONS = ("seed", "repeat", "stop", "client", "slo")

assert PERCENTILE_METHOD == "linear", "the weighted percentile below reproduces numpy's linear method only"


class RunFolderError(ValueError):
    """The path is not a readable kvbench run folder (bad input: the CLI exits 2)."""


class Verdict(str, Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_CHANGE = "no change"
    MISSING = "missing"


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


# --- per-request samples and vectorised statistics ---------------------------------------------------------


@dataclass(frozen=True)
class RequestSamples:
    """Per-request quantities of one repetition's measured, successful requests (NaN = not reported)."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    itl_ms: np.ndarray  # every inter-token gap, pooled
    itl_owner: np.ndarray  # index of the request each gap belongs to
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    reusable_tokens: np.ndarray
    # Seconds of the run attributed to each request: the time from the previous completion (or the first send)
    # to its own completion. They sum to the run's duration, so throughput is a ratio of sums (a renewal view),
    # and resampling them carries the duration's noise into the interval.
    span_s: np.ndarray

    @property
    def size(self) -> int:
        return int(self.output_tokens.size)

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> "RequestSamples":
        ok = [record for record in records if not record.warmup and record.ok]

        def column(values) -> np.ndarray:
            return np.array([np.nan if value is None else value for value in values], dtype=np.float64)

        gaps = [itl_ms(record) for record in ok]
        sent = [record.sent_ns for record in ok if record.sent_ns is not None]
        span = np.zeros(len(ok))
        finished = sorted((record.done_ns, index) for index, record in enumerate(ok) if record.done_ns is not None)
        if sent and finished:
            previous = min(sent)
            for done_ns, index in finished:
                span[index] = (done_ns - previous) / NS_PER_S
                previous = done_ns
        return cls(
            ttft_ms=column(ttft_ms(record) for record in ok),
            tpot_ms=column(tpot_ms(record) for record in ok),
            e2e_ms=column(e2e_ms(record) for record in ok),
            itl_ms=np.array([gap for request in gaps for gap in request], dtype=np.float64),
            itl_owner=np.array([index for index, request in enumerate(gaps) for _ in request], dtype=np.int64),
            output_tokens=column(output_token_count(record) or 0 for record in ok),
            prompt_tokens=column(record.prompt_tokens for record in ok),
            cached_tokens=column(record.cached_tokens for record in ok),
            reusable_tokens=column(record.reusable_tokens for record in ok),
            span_s=span,
        )


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


def _percentile_of(attribute: str, q: float) -> Callable[[RequestSamples, np.ndarray], np.ndarray]:
    def statistic(samples: RequestSamples, counts: np.ndarray) -> np.ndarray:
        values = getattr(samples, attribute)
        present = np.flatnonzero(~np.isnan(values))
        order = present[np.argsort(values[present], kind="stable")]
        return weighted_percentile(values[order], counts[:, order], q)

    return statistic


def _itl_percentile(q: float) -> Callable[[RequestSamples, np.ndarray], np.ndarray]:
    def statistic(samples: RequestSamples, counts: np.ndarray) -> np.ndarray:
        order = np.argsort(samples.itl_ms, kind="stable")
        # A resampled request brings all its gaps, as many times as it was drawn.
        return weighted_percentile(samples.itl_ms[order], counts[:, samples.itl_owner[order]], q)

    return statistic


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan)


def _per_second(tokens: Callable[[RequestSamples], np.ndarray]) -> Callable[[RequestSamples, np.ndarray], np.ndarray]:
    def statistic(samples: RequestSamples, counts: np.ndarray) -> np.ndarray:
        return _ratio(counts @ tokens(samples), counts @ samples.span_s)

    return statistic


def _cache_rate(numerator: Callable[[RequestSamples], np.ndarray], denominator: Callable[[RequestSamples], np.ndarray]):
    def statistic(samples: RequestSamples, counts: np.ndarray) -> np.ndarray:
        # cache_accounting counts requests with a prompt size; without every cached count the rate is missing.
        counted = ~np.isnan(samples.prompt_tokens)
        if np.isnan(samples.cached_tokens[counted]).any():
            return np.full(counts.shape[0], np.nan)
        selected = counts[:, counted]
        return _ratio(selected @ numerator(samples)[counted], selected @ denominator(samples)[counted])

    return statistic


@dataclass(frozen=True)
class PerfMetric:
    """A metric of `summary.json` (`stored`) and the same metric on resampled requests (`statistic`)."""

    spec: MetricSpec
    stored: Callable[[Mapping], float | None]  # from a summary's "overall" group
    statistic: Callable[[RequestSamples, np.ndarray], np.ndarray]


def _stat(metric: str, stat: str) -> Callable[[Mapping], float | None]:
    return lambda overall: (overall.get(metric) or {}).get(stat)


def _perf_metrics() -> dict[str, PerfMetric]:
    lower, higher = "lower", "higher"
    rel, points = "relative", "points"
    prompt = lambda s: np.nan_to_num(s.prompt_tokens)  # noqa: E731 - summarize counts a missing prompt as 0
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
        ("total_tok_s", higher, rel, 0.05, lambda o: o.get("total_tok_s"),
         _per_second(lambda s: s.output_tokens + prompt(s))),
        ("req_s", higher, rel, 0.05, lambda o: o.get("req_s"), _per_second(lambda s: np.ones(s.size))),
        ("cache_hit_rate", higher, points, 0.02, lambda o: o["cache"].get("cache_hit_rate"),
         _cache_rate(lambda s: s.cached_tokens, lambda s: s.prompt_tokens)),
        ("prefill_recompute_rate", lower, points, 0.02, lambda o: o["cache"].get("prefill_recompute_rate"),
         _cache_rate(lambda s: np.maximum(s.reusable_tokens - s.cached_tokens, 0), lambda s: s.reusable_tokens)),
    ]
    return {name: PerfMetric(MetricSpec(name, better, scale, tol), stored, stat) for name, better, scale, tol, stored, stat in table}


PERF_METRICS: Mapping[str, PerfMetric] = _perf_metrics()
DEFAULT_METRICS = ("ttft_p50", "ttft_p99", "itl_p50", "output_tok_s", "cache_hit_rate", "prefill_recompute_rate")

# Quality metrics of eval.json. Known names first; any other name is judged by the words in it.
_QUALITY_SPECS = {
    "kl": MetricSpec("kl", "lower", "relative", 0.10),
    "top1_agreement": MetricSpec("top1_agreement", "higher", "points", 0.005),
}
_LOWER_IS_BETTER_WORDS = ("kl", "perplexity", "ppl", "nll", "loss", "error", "mse", "divergence")


def quality_spec(name: str) -> MetricSpec:
    """kl: lower, 10% relative; top1_agreement: higher, 0.5 points; names with loss/ppl/error/...: lower, 1%;
    any other score (task accuracy and the like): higher is better, 1% relative (the article's bar is <0.5%
    aggregate loss, so 1% on one task is already worth a look)."""
    if name in _QUALITY_SPECS:
        return _QUALITY_SPECS[name]
    words = name.lower().replace("-", "_").split("_")
    better = "lower" if any(word in _LOWER_IS_BETTER_WORDS for word in words) else "higher"
    return MetricSpec(name, better, "relative", 0.01)


# --- run folders -------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Repetition:
    entry: Mapping  # the summary.json entry
    samples: RequestSamples | None  # None when requests.jsonl holds none of its records


@dataclass(frozen=True)
class RunData:
    """What `compare` needs from a run folder."""

    path: Path
    settings: Mapping[SettingKey, tuple[Repetition, ...]]
    config: Mapping = field(default_factory=dict)
    env: Mapping = field(default_factory=dict)
    evals: Mapping[str, Mapping[str, float | None]] | None = None


def setting_key(entry: Mapping) -> SettingKey:
    return SettingKey(str(entry["engine"]), str(entry.get("kv_dtype", "unknown")), str(entry["workload"]), str(entry["load"]))


def read_run_folder(path: Path) -> RunData:
    """Read summary.json (required), requests.jsonl, config.yaml, env.json and eval.json (optional)."""
    if not path.is_dir():
        raise RunFolderError(f"{path}: not a folder (give a kvbench run folder or a results/baselines/<name> folder)")
    summary = path / SUMMARY_JSON
    if not summary.exists():
        raise RunFolderError(f"{path}: no {SUMMARY_JSON}; is this a kvbench run folder? (`kvbench run ... --out DIR`)")
    try:
        entries = json.loads(summary.read_text())["runs"]
        keys = [setting_key(entry) for entry in entries]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise RunFolderError(f"{summary}: not a kvbench summary ({type(exc).__name__}: {exc}); rerun `kvbench report`") from None
    records: dict[str, list[RequestRecord]] = {}
    if (path / REQUESTS_JSONL).exists():
        for record in read_records(path / REQUESTS_JSONL):
            records.setdefault(record.run_id, []).append(record)
    settings: dict[SettingKey, list[Repetition]] = {}
    for key, entry in zip(keys, entries):
        own = records.get(entry.get("run_id", ""))
        settings.setdefault(key, []).append(Repetition(entry, RequestSamples.of(own) if own else None))
    return RunData(
        path=path,
        settings={key: tuple(reps) for key, reps in settings.items()},
        config=_optional_mapping(path / CONFIG_YAML, yaml.safe_load),
        env=_optional_mapping(path / ENV_JSON, json.loads),
        evals=_read_evals(path / EVAL_JSON),
    )


def _optional_mapping(path: Path, parse: Callable[[str], object]) -> Mapping:
    if not path.exists():
        return {}
    try:
        data = parse(path.read_text())
    except (ValueError, yaml.YAMLError) as exc:
        raise RunFolderError(f"{path}: cannot parse ({exc})") from None
    return data if isinstance(data, Mapping) else {}


def _read_evals(path: Path) -> dict[str, dict[str, float | None]] | None:
    """eval.json: {"settings": [{"kv_setting": NAME, "metrics": {METRIC: VALUE, ...}}, ...]}."""
    if not path.exists():
        return None
    try:
        settings = json.loads(path.read_text())["settings"]
        return {
            str(item["kv_setting"]): {str(name): None if value is None else float(value) for name, value in item["metrics"].items()}
            for item in settings
        }
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunFolderError(
            f"{path}: expected {{\"settings\": [{{\"kv_setting\": ..., \"metrics\": {{name: number}}}}]}} ({exc})"
        ) from None


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
    def mismatched(self) -> bool:
        return bool(self.mismatches) or any(row.one_sided for row in self.rows)

    def exit_code(self, strict: bool = False) -> int:
        """1 on any regression (or, when strict, any mismatch), else 0."""
        return 1 if self.regressions or (strict and self.mismatched) else 0


def judge(spec: MetricSpec, delta: float | None, ci: tuple[float, float] | None) -> Verdict:
    """Regression: the CI lies wholly on the bad side of 0 and the delta exceeds the tolerance; improvement
    likewise on the good side. Without a CI (quality evals, no per-request records) the tolerance alone decides."""
    if delta is None or math.isnan(delta):
        return Verdict.MISSING
    sign = 1.0 if spec.better == "lower" else -1.0  # worse > 0 after this sign
    worse = sign * delta
    worse_low, worse_high = sorted((sign * ci[0], sign * ci[1])) if ci is not None else (worse, worse)
    if worse > spec.tolerance and worse_low > 0:
        return Verdict.REGRESSION
    if -worse > spec.tolerance and worse_high < 0:
        return Verdict.IMPROVEMENT
    return Verdict.NO_CHANGE


def delta_of(spec: MetricSpec, baseline: float, new: float) -> float:
    """new/baseline - 1 (relative; +-inf from a baseline of 0) or new - baseline (points)."""
    if spec.scale == "points":
        return new - baseline
    if baseline == 0:
        return 0.0 if new == 0 else math.copysign(math.inf, new)
    return new / baseline - 1.0


def compare(baseline: RunData, new: RunData, options: CompareOptions = CompareOptions()) -> Comparison:
    """Compare every setting and metric of `new` against `baseline` (see the module docstring)."""
    mismatches = _config_mismatches(baseline.config, new.config)
    notes = _env_notes(baseline.env, new.env)
    rows: list[MetricComparison] = []
    keys = list(baseline.settings) + [key for key in new.settings if key not in baseline.settings]
    for index, key in enumerate(keys):
        base_reps, new_reps = baseline.settings.get(key), new.settings.get(key)
        if base_reps is None or new_reps is None:
            where = "baseline" if new_reps is None else "new run"
            hint = "did it fail to start or was it removed?" if new_reps is None else "promote a new baseline"
            rows.append(MetricComparison("perf", key.label, key.kv_dtype, "all", None, None, None, None, None, None,
                                         Verdict.MISSING, f"setting only in the {where} ({hint})"))
            mismatches.append(f"{key.label} [{key.kv_dtype}]: only in the {where}")
            continue
        mismatches += [f"{key.label} [{key.kv_dtype}]: {text}" for text in _setting_mismatches(base_reps, new_reps)]
        notes += [f"{key.label} [{key.kv_dtype}]: {text}" for text in _validity_notes(base_reps, new_reps)]
        base_counts = _resample_counts(base_reps, options, (0, index))
        new_counts = _resample_counts(new_reps, options, (1, index))
        for name in options.metrics:
            rows.append(_compare_metric(key, PERF_METRICS[name], options, base_reps, new_reps, base_counts, new_counts, index))
    eval_rows, eval_mismatches = _compare_evals(baseline.evals, new.evals, options)
    rows += eval_rows
    mismatches += eval_mismatches
    return Comparison(str(baseline.path), str(new.path), options, tuple(rows), tuple(mismatches), tuple(notes))


def _spec(spec: MetricSpec, options: CompareOptions) -> MetricSpec:
    if spec.name in options.tolerances:
        return MetricSpec(spec.name, spec.better, spec.scale, options.tolerances[spec.name])
    return spec


def _resample_counts(reps: Sequence[Repetition], options: CompareOptions, stream: tuple[int, int]) -> list[np.ndarray | None]:
    """Per repetition, how often each request is drawn in each resample (resamples x requests)."""
    rng = np.random.default_rng(np.random.SeedSequence([options.seed, *stream]))
    counts = []
    for rep in reps:
        if rep.samples is None or rep.samples.size == 0:
            counts.append(None)
            continue
        n = rep.samples.size
        counts.append(rng.multinomial(n, np.full(n, 1.0 / n), size=options.resamples).astype(np.int32))
    return counts


def _replicates(metric: PerfMetric, reps: Sequence[Repetition], counts: Sequence[np.ndarray | None], options: CompareOptions,
                stream: tuple[int, ...]) -> np.ndarray | None:
    """Bootstrap replicates of the mean over repetitions: repetitions drawn with replacement, and within each
    drawn repetition one of its request resamples (a different one for every slot)."""
    if any(count is None for count in counts):
        return None
    per_rep = np.stack([metric.statistic(rep.samples, count) for rep, count in zip(reps, counts)])  # reps x B
    k, resamples = per_rep.shape
    if k == 1:
        return per_rep[0]
    rng = np.random.default_rng(np.random.SeedSequence([options.seed, *stream]))
    chosen = rng.integers(0, k, size=(resamples, k))
    columns = (np.arange(resamples)[:, None] + np.arange(k)[None, :] * max(1, resamples // k)) % resamples
    return per_rep[chosen, columns].mean(axis=1)


def _compare_metric(key: SettingKey, metric: PerfMetric, options: CompareOptions, base_reps, new_reps,
                    base_counts, new_counts, index: int) -> MetricComparison:
    spec = _spec(metric.spec, options)
    base_values = [metric.stored(rep.entry["summary"]["overall"]) for rep in base_reps]
    new_values = [metric.stored(rep.entry["summary"]["overall"]) for rep in new_reps]
    base = None if any(value is None for value in base_values) else float(np.mean(base_values))
    new = None if any(value is None for value in new_values) else float(np.mean(new_values))

    def row(delta, ci, verdict, note=""):
        return MetricComparison("perf", key.label, key.kv_dtype, spec.name, spec, base, new, delta,
                                ci[0] if ci else None, ci[1] if ci else None, verdict, note)

    if base is None or new is None:
        sides = [side for side, value in (("baseline", base), ("new run", new)) if value is None]
        return row(None, None, Verdict.MISSING, f"not reported in the {' and the '.join(sides)}")
    delta = delta_of(spec, base, new)
    metric_index = list(PERF_METRICS).index(spec.name)
    base_boot = _replicates(metric, base_reps, base_counts, options, (2, index, metric_index))
    new_boot = _replicates(metric, new_reps, new_counts, options, (3, index, metric_index))
    ci, note = None, ""
    if base_boot is None or new_boot is None:
        note = "no per-request records: no CI, judged by the tolerance alone"
    else:
        ci, note = _interval(spec, base_boot, new_boot, options.confidence)
    return row(delta, ci, judge(spec, delta, ci), note)


def _interval(spec: MetricSpec, base_boot: np.ndarray, new_boot: np.ndarray, confidence: float):
    if spec.scale == "points":
        deltas = new_boot - base_boot
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            deltas = new_boot / base_boot - 1.0
    finite = deltas[np.isfinite(deltas)]
    if finite.size < 0.99 * deltas.size:
        return None, "bootstrap degenerate (baseline near 0 or metric missing in resamples): judged by the tolerance alone"
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return (float(low), float(high)), ""


def _compare_evals(baseline, new, options: CompareOptions) -> tuple[list[MetricComparison], list[str]]:
    """Rows for every eval setting and metric, and a mismatch when only one folder has an eval.json."""
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
        for name in list(base_metrics) + [name for name in new_metrics if name not in base_metrics]:
            spec = _spec(quality_spec(name), options)
            base, value = base_metrics.get(name), new_metrics.get(name)
            if base is None or value is None:
                sides = [side for side, item in (("baseline", base), ("new run", value)) if item is None]
                rows.append(MetricComparison("quality", setting, setting, name, spec, base, value, None, None, None,
                                             Verdict.MISSING, f"not reported in the {' and the '.join(sides)}"))
                continue
            delta = delta_of(spec, base, value)
            rows.append(MetricComparison("quality", setting, setting, name, spec, base, value, delta, None, None,
                                         judge(spec, delta, None), "deterministic eval: judged by the tolerance"))
    return rows, []


def _differences(base: Mapping, new: Mapping, prefix: str = "") -> list[str]:
    out = []
    for key in list(base) + [key for key in new if key not in base]:
        a, b = base.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def _config_mismatches(base: Mapping, new: Mapping) -> list[str]:
    if not base or not new:
        return [] if not base and not new else [f"{CONFIG_YAML} only in the {'baseline' if base else 'new run'}"]
    diffs = _differences({key: base.get(key) for key in _CONFIG_SECTIONS}, {key: new.get(key) for key in _CONFIG_SECTIONS})
    return [f"{CONFIG_YAML} differs: {diff}" for diff in diffs]


def _setting_mismatches(base_reps: Sequence[Repetition], new_reps: Sequence[Repetition]) -> list[str]:
    out = []
    base, new = base_reps[0].entry, new_reps[0].entry
    out += [f"workload params differ: {diff}" for diff in _differences(base.get("workload_params") or {}, new.get("workload_params") or {})]
    out += [f"engine settings differ: {diff}" for diff in _differences(base.get("engine_settings") or {}, new.get("engine_settings") or {})]
    if len(base_reps) != len(new_reps):
        out.append(f"repetitions differ: {len(base_reps)} -> {len(new_reps)}")
    return out


def _validity_notes(base_reps: Sequence[Repetition], new_reps: Sequence[Repetition]) -> list[str]:
    out = []
    for side, reps in (("baseline", base_reps), ("new run", new_reps)):
        for rep in reps:
            if not rep.entry.get("valid", True):
                reason = ("; ".join(rep.entry.get("invalid_reasons") or ()) or rep.entry.get("aborted")
                          or (rep.entry.get("client") or {}).get("reason") or "see summary.md")
                out.append(f"{side} repetition r{rep.entry.get('repeat', 0)} is marked invalid ({reason})")
    return out


def _env_notes(base: Mapping, new: Mapping) -> list[str]:
    out = []
    for key in ("cpu", "gpu", "cpu_count"):
        if base.get(key) != new.get(key) and base and new:
            out.append(f"measured on different machines: {key} {base.get(key)!r} -> {new.get(key)!r}")
    return out
