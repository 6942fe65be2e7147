"""Quality verdicts: every metric of eval.json's settings, judged by its tolerance (a deterministic eval has no
interval), its direction from the metric's own source (directions.py)."""

from __future__ import annotations

from collections.abc import Mapping

from kvbench.measure.run_folder import EVAL_JSON, RunFolder
from kvbench.verdicts.gate_metrics import quality_spec
from kvbench.verdicts.verdict import CompareOptions, MetricComparison, Verdict, delta_of, judge, with_tolerance


def compare_evals(
    baseline_folder: RunFolder, new_folder: RunFolder, options: CompareOptions
) -> tuple[list[MetricComparison], list[str]]:
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
            rows.append(
                MetricComparison(
                    "quality",
                    setting,
                    setting,
                    "all",
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    Verdict.MISSING,
                    f"eval setting only in the {where}",
                )
            )
            continue
        # The new run's recorded directions first (its lm-eval said so), then the baseline's.
        recorded = {**baseline_folder.eval_directions.get(setting, {}), **new_folder.eval_directions.get(setting, {})}
        rows += [
            _compare_quality(setting, name, base_metrics.get(name), new_metrics.get(name), recorded, options)
            for name in list(base_metrics) + [name for name in new_metrics if name not in base_metrics]
        ]
    return rows, []


def _compare_quality(
    setting: str,
    name: str,
    base: float | None,
    value: float | None,
    recorded: Mapping[str, bool],
    options: CompareOptions,
) -> MetricComparison:
    spec = quality_spec(name, recorded)
    if spec is None:
        return MetricComparison(
            "quality",
            setting,
            setting,
            name,
            None,
            base,
            value,
            None,
            None,
            None,
            Verdict.INCONCLUSIVE,
            "direction unknown: neither lm-eval's higher_is_better nor "
            "kvbench's table (verdicts/directions.py) declares it",
        )
    spec = with_tolerance(spec, options)
    if base is None or value is None:
        sides = [side for side, item in (("baseline", base), ("new run", value)) if item is None]
        return MetricComparison(
            "quality",
            setting,
            setting,
            name,
            spec,
            base,
            value,
            None,
            None,
            None,
            Verdict.MISSING,
            f"not reported in the {' and the '.join(sides)}",
        )
    delta = delta_of(spec, base, value)
    return MetricComparison(
        "quality",
        setting,
        setting,
        name,
        spec,
        base,
        value,
        delta,
        None,
        None,
        judge(spec, delta, None),
        "deterministic eval: judged by the tolerance",
    )
