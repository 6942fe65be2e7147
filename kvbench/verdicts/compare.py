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

Pure: the folders come in read (`run_folder.read_run_folder`); nothing here prints. This module matches the
settings and says whether the folders measure the same thing; `perf.py` judges the performance metrics and
`quality.py` eval.json's, each row by `verdict.judge`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvbench.harness import config_schema
from kvbench.measure.run_folder import CONFIG_YAML, SUMMARY_MD, RunFolder
from kvbench.verdicts.perf import Repetition, compare_setting, settings_of
from kvbench.verdicts.quality import compare_evals
from kvbench.verdicts.verdict import CompareOptions, MetricComparison, Verdict

__all__ = ["CompareOptions", "Comparison", "MetricComparison", "Verdict", "compare"]

# config.yaml sections that must agree for two runs to be comparable (engines and workloads are checked per
# setting, where a difference is attributed to the setting it belongs to).
_CONFIG_SECTIONS = ("seed", "repeat", "stop", "client", "slo")


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


def compare(baseline: RunFolder, new: RunFolder, options: CompareOptions = CompareOptions()) -> Comparison:
    """Compare every setting and metric of `new` against `baseline` (see the module docstring)."""
    mismatches, notes = _config_mismatches(baseline.config, new.config)
    notes += _env_notes(baseline.env, new.env)
    rows: list[MetricComparison] = []
    base_settings, new_settings = settings_of(baseline), settings_of(new)
    keys = list(base_settings) + [key for key in new_settings if key not in base_settings]
    for index, key in enumerate(keys):
        base_reps, new_reps = base_settings.get(key), new_settings.get(key)
        if base_reps is None or new_reps is None:
            where = "baseline" if new_reps is None else "new run"
            hint = "did it fail to start or was it removed?" if new_reps is None else "promote a new baseline"
            rows.append(
                MetricComparison(
                    "perf",
                    key.label,
                    key.kv_dtype,
                    "all",
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    Verdict.MISSING,
                    f"setting only in the {where} ({hint})",
                )
            )
            mismatches.append(f"{key.label} [{key.kv_dtype}]: only in the {where}")
            continue
        mismatches += [f"{key.label} [{key.kv_dtype}]: {text}" for text in _setting_mismatches(base_reps, new_reps)]
        notes += [
            f"{key.label} [{key.kv_dtype}]: {text}"
            for text in _address_notes(base_reps, new_reps) + _validity_notes(base_reps, new_reps)
        ]
        rows += compare_setting(key, index, base_reps, new_reps, options)
    eval_rows, eval_mismatches = compare_evals(baseline, new, options)
    rows += eval_rows
    mismatches += eval_mismatches
    return Comparison(str(baseline.path), str(new.path), options, tuple(rows), tuple(mismatches), tuple(notes))


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
    notes = [
        f"{side} {CONFIG_YAML} is schema version {item.version}: read with today's defaults for "
        + ", ".join(item.filled)
        for side, item in zip(("baseline", "new run"), read)
        if item.filled and read[0].version != read[1].version
    ]
    diffs = _differences(*({key: item.config.get(key) for key in _CONFIG_SECTIONS} for item in read))
    return [f"{CONFIG_YAML} differs: {diff}" for diff in diffs], notes


def _setting_mismatches(base_reps: Sequence[Repetition], new_reps: Sequence[Repetition]) -> list[str]:
    out = []
    base, new = base_reps[0].entry, new_reps[0].entry
    out += [f"workload params differ: {diff}" for diff in _differences(base.workload_params, new.workload_params)]
    out += [
        f"engine settings differ: {diff}"
        for diff in _differences(_endpoint_identity(base.engine_settings), _endpoint_identity(new.engine_settings))
    ]
    if len(base_reps) != len(new_reps):
        out.append(f"repetitions differ: {len(base_reps)} -> {len(new_reps)}")
    return out


def _endpoint_identity(settings: Mapping) -> Mapping:
    """An endpoint's settings with its URL's host and port left out: one server measured at another address
    (a second port, a forwarded one) measures the same thing; its path (a different API) does not."""
    url = settings.get("url")
    if not isinstance(url, str):
        return settings
    return {**settings, "url": urlsplit(url if "//" in url else "//" + url).path.rstrip("/")}


def _address_notes(base_reps: Sequence[Repetition], new_reps: Sequence[Repetition]) -> list[str]:
    base, new = base_reps[0].entry.engine_settings.get("url"), new_reps[0].entry.engine_settings.get("url")
    if base == new or _endpoint_identity({"url": base}) != _endpoint_identity({"url": new}):
        return []
    return [f"the endpoint moved: {base} -> {new} (host and port are where it listens, not what it is: compared)"]


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
