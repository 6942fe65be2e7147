"""Eval results of one run: per-setting scores, deltas against the baseline, the aggregate, and their files.

    eval.md / eval.csv   one row per (setting, source, metric): value, stderr, baseline, delta, delta %
    eval_summary.csv     one row per setting: headline metrics and the aggregate delta %
    eval.json            {"settings": [{"kv_setting": label, "metrics": {name: value}}]} for `kvbench compare`

Aggregate delta % (the article's "-0.3% aggregate"): the mean over tasks of each task's headline metric's
relative change, signed so that negative is a loss (accuracy new/base - 1; perplexity base/new - 1).
Computing here, formatting in `write_tables`: the table code only lays out what these functions return.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.evals.divergence import DivergenceStats, GreedyStats
from kvbench.evals.lm_eval_run import TaskScore
from kvbench.evals.tasks import TASKS
from kvbench.measure.run_folder import EVAL_CSV, EVAL_JSON, EVAL_MD, EVAL_SUMMARY_CSV

LOWER_IS_BETTER = ("perplexity", "bits_per_byte", "kl")


@dataclass(frozen=True)
class SettingResult:
    """Everything measured for one KV setting (None: that part was not run, or the engine cannot do it)."""

    label: str
    task_scores: tuple[TaskScore, ...] = ()
    divergence: DivergenceStats | None = None
    divergence_method: str = ""  # "exact (full vocabulary)" or "top-k approximation"
    greedy: GreedyStats | None = None


@dataclass(frozen=True)
class MetricRow:
    setting: str
    source: str  # "lm-eval" or "direct"
    name: str  # "task/metric" or a divergence measure
    value: float | None
    stderr: float | None
    baseline: float | None
    delta: float | None  # value - baseline
    delta_pct: float | None  # signed: negative = worse (see the module docstring)


def _lower_is_better(name: str) -> bool:
    return any(word in name for word in LOWER_IS_BETTER)


def signed_change_pct(name: str, value: float | None, base: float | None) -> float | None:
    """Relative change in %, negative when quality got worse; None when undefined (missing or zero base)."""
    if value is None or base is None or base == 0 or value == 0 and _lower_is_better(name):
        return None
    change = base / value - 1.0 if _lower_is_better(name) else value / base - 1.0
    return 100.0 * change


def metric_values(result: SettingResult) -> dict[str, tuple[str, float | None, float | None]]:
    """name -> (source, value, stderr) for every metric of a setting."""
    out: dict[str, tuple[str, float | None, float | None]] = {}
    for score in result.task_scores:
        out[f"{score.task}/{score.metric}"] = ("lm-eval", score.value, score.stderr)
    if result.divergence is not None:
        d = result.divergence
        out["kl"] = ("direct", d.kl, None)
        out["top1_agreement"] = ("direct", d.top1_agreement, _binomial_stderr(d.top1_agreement, d.positions))
        out["perplexity"] = ("direct", d.perplexity, None)
    if result.greedy is not None:
        g = result.greedy
        out["greedy_exact_match"] = ("direct", g.exact_match_rate, _binomial_stderr(g.exact_match_rate, g.prompts))
        out["greedy_first_diff_pos"] = ("direct", g.mean_first_divergence, None)
        out["greedy_matching_prefix"] = ("direct", g.matching_prefix_rate, None)
    return out


def _binomial_stderr(p: float, n: int) -> float | None:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None


def metric_rows(results: Sequence[SettingResult], baseline: str) -> list[MetricRow]:
    base_values = metric_values(next(r for r in results if r.label == baseline))
    rows = []
    for result in results:
        for name, (source, value, stderr) in metric_values(result).items():
            base = base_values.get(name, (source, None, None))[1]
            delta = None if value is None or base is None else value - base
            rows.append(MetricRow(result.label, source, name, value, stderr, base, delta,
                                  signed_change_pct(name, value, base)))
    return rows


def headline_name(task: str) -> str:
    return f"{task}/{TASKS[task][1]}"


def aggregate_delta_pct(rows: Sequence[MetricRow], setting: str) -> float | None:
    """Mean signed % change of the tasks' headline metrics for `setting`; None without any task."""
    headlines = {headline_name(task) for task in TASKS}
    changes = [row.delta_pct for row in rows if row.setting == setting and row.name in headlines]
    if not changes or any(change is None for change in changes):
        return None
    return sum(changes) / len(changes)


def summary_frame(results: Sequence[SettingResult], baseline: str) -> pd.DataFrame:
    """One row per setting: headline task scores, divergence measures, the aggregate delta %."""
    rows = metric_rows(results, baseline)
    table = []
    for result in results:
        values = {name: value for name, (_, value, _) in metric_values(result).items()}
        entry: dict[str, object] = {"kv_setting": result.label}
        for task in TASKS:
            if headline_name(task) in values:
                entry[headline_name(task)] = values[headline_name(task)]
        entry["aggregate_delta_pct"] = aggregate_delta_pct(rows, result.label)
        for name in ("perplexity", "kl", "top1_agreement", "greedy_exact_match", "greedy_first_diff_pos"):
            if name in values:
                entry[name] = values[name]
        if result.divergence is not None:
            entry["perplexity_delta_pct"] = 100.0 * result.divergence.perplexity_delta
        table.append(entry)
    return pd.DataFrame(table)


def eval_json(results: Sequence[SettingResult], baseline: str) -> dict:
    """What `kvbench compare` reads: every metric's value, plus the aggregate delta %."""
    rows = metric_rows(results, baseline)
    settings = []
    for result in results:
        metrics = {name: value for name, (_, value, _) in metric_values(result).items()}
        metrics["aggregate_delta_pct"] = aggregate_delta_pct(rows, result.label)
        settings.append({"kv_setting": result.label, "metrics": metrics})
    return {"baseline": baseline, "settings": settings}


def write_tables(results: Sequence[SettingResult], baseline: str, run_dir: Path,
                 notes: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Write eval.md, eval.csv, eval_summary.csv and eval.json into `run_dir`; returns their paths."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = pd.DataFrame([row.__dict__ for row in metric_rows(results, baseline)])
    summary = summary_frame(results, baseline)
    paths = {name: run_dir / name for name in (EVAL_MD, EVAL_CSV, EVAL_SUMMARY_CSV, EVAL_JSON)}
    rows.to_csv(paths[EVAL_CSV], index=False)
    summary.to_csv(paths[EVAL_SUMMARY_CSV], index=False)
    paths[EVAL_JSON].write_text(json.dumps(eval_json(results, baseline), indent=2))
    lines = [f"# KV quality eval (baseline: {baseline})", ""]
    lines += [f"- {key}: {value}" for key, value in (notes or {}).items()]
    lines += ["", "## Summary", "", _markdown(summary, _summary_format), "", "## Every metric", "",
              "delta % is signed: negative = worse than the baseline (perplexity and KL: lower is better).", "",
              _markdown(rows, _row_format), ""]
    paths[EVAL_MD].write_text("\n".join(lines))
    return paths


def _summary_format(column: str, value: object) -> str:
    if column in ("top1_agreement", "greedy_exact_match") or column.endswith("/acc") or column.endswith("/exact_match"):
        return f"{100 * value:.1f}%"
    if column.endswith("_pct"):
        return f"{value:+.2f}%"
    if column == "kl":
        return f"{value:.2e}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _row_format(column: str, value: object) -> str:
    if column == "delta_pct":
        return f"{value:+.2f}%"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _markdown(frame: pd.DataFrame, fmt) -> str:
    """A GitHub table; missing values print as n/a (never as 0)."""
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = []
    for _, row in frame.iterrows():
        cells = ["n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt(column, value)
                 for column, value in row.items()]
        body.append("| " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *body])
