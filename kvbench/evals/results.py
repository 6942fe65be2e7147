"""Eval results of one run: per-setting scores, paired deltas against the baseline with 95% intervals, and files.

    eval.md / eval.csv   one row per (setting, source, metric): value, stderr, baseline, delta, delta %, the
                         paired bootstrap interval (ci_low, ci_high of `ci_of`: the delta % where there is one,
                         else the value), McNemar's p for flips, the items paired, and the verdict on the
                         article's "loss < 0.5%" ("cannot resolve" when the interval is wider than that)
    eval_summary.csv     one row per setting: headline metrics and the aggregate delta %
    eval.json            {"settings": [{"kv_setting": label, "metrics": {name: value}, "higher_is_better":
                         {name: bool}}]} for `kvbench compare`
    eval_positions.png   KL, top-1 agreement and perplexity change per context-position bucket

Sources of rows: "lm-eval" (documents paired by doc_id), "direct" (blocks of positions, exact logits),
"pos A-B" (the same per context-position bucket), "greedy" (prompts), "passkey" (prompts per length).
Aggregate delta % (the article's "-0.3% aggregate"): the mean over tasks of each task's headline metric's
relative change, signed so that negative is a loss (accuracy new/base - 1; perplexity base/new - 1).
Computing here, formatting in `write_tables`: the table code only lays out what these functions return.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import numpy as np

from kvbench.evals.directions import higher_is_better
from kvbench.evals.divergence import DivergenceStats, GreedyStats
from kvbench.evals.items import DirectMetric
from kvbench.evals.lm_eval_run import TaskScore
from kvbench.evals.paired import (
    CLAIM_PCT, McNemar, PairedDelta, mcnemar_exact, paired_binary_difference, paired_ratio, proportion_ci, verdict,
)
from kvbench.evals.tasks import TASKS
from kvbench.measure.run_folder import EVAL_CSV, EVAL_JSON, EVAL_MD, EVAL_POSITIONS_PNG, EVAL_SUMMARY_CSV



@dataclass(frozen=True)
class PasskeyOutcome:
    """Passkey prompts of one length, in depth order: whether each was retrieved."""

    length: int
    depths: tuple[float, ...]
    retrieved: tuple[bool, ...]


@dataclass(frozen=True)
class SettingResult:
    """Everything measured for one KV setting (None / empty: that part was not run, or the engine cannot).

    `direct` are the exact measures over every scored position, `positions` the same per context-position
    bucket ((low, high, metrics)), `passkey` one outcome per haystack length."""

    label: str
    task_scores: tuple[TaskScore, ...] = ()
    divergence: DivergenceStats | None = None
    divergence_method: str = ""  # "exact (full vocabulary)" or "top-k approximation"
    greedy: GreedyStats | None = None
    direct: tuple[DirectMetric, ...] = ()
    positions: tuple[tuple[int, int, tuple[DirectMetric, ...]], ...] = ()
    passkey: tuple[PasskeyOutcome, ...] = ()
    refused: str | None = None  # the engine would not serve this setting: its reason (nothing else measured)


@dataclass(frozen=True)
class MetricRow:
    setting: str
    source: str  # "lm-eval", "direct", "pos A-B", "greedy", "passkey"
    name: str  # "task/metric" or a divergence measure
    value: float | None
    stderr: float | None
    baseline: float | None
    delta: float | None  # value - baseline
    delta_pct: float | None  # signed: negative = worse (see the module docstring)
    ci_low: float | None = None  # the 95% interval of `ci_of`
    ci_high: float | None = None
    ci_of: str | None = None  # "delta_pct" or "value"
    p_value: float | None = None  # McNemar's exact test on flips against the baseline
    items: int | None = None  # paired items behind the interval (blocks, documents, prompts)
    verdict: str | None = None  # on "loss < 0.5%", for rows with a delta % interval


def _lower_is_better(name: str) -> bool:
    """From the metric's source (evals/directions.py); a metric no source declares counts as a score."""
    return higher_is_better(name) is False


def signed_change_pct(name: str, value: float | None, base: float | None) -> float | None:
    """Relative change in %, negative when quality got worse; None when undefined (missing or zero base)."""
    if value is None or base is None or base == 0 or value == 0 and _lower_is_better(name):
        return None
    change = base / value - 1.0 if _lower_is_better(name) else value / base - 1.0
    return 100.0 * change


def _binomial_stderr(p: float, n: int) -> float | None:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None


def _row(setting, source, name, value, base, stderr=None, delta_pct: PairedDelta | None = None,
         value_ci: tuple[float, float] | None = None, mcnemar: McNemar | None = None, items=None) -> MetricRow:
    delta = None if value is None or base is None else value - base
    pct = delta_pct.delta if delta_pct is not None else signed_change_pct(name, value, base)
    low = high = of = judged = None
    if delta_pct is not None and delta_pct.ci_low is not None:
        low, high, of = delta_pct.ci_low, delta_pct.ci_high, "delta_pct"
    elif value_ci is not None:
        low, high, of = value_ci[0], value_ci[1], "value"
    if delta_pct is not None:
        judged = verdict(delta_pct)
    return MetricRow(setting, source, name, value, stderr, base, delta, pct, low, high, of,
                     None if mcnemar is None else mcnemar.p_value, items, judged)


def _task_rows(result: SettingResult, base: SettingResult) -> list[MetricRow]:
    base_scores = {(s.task, s.metric): s for s in base.task_scores}
    rows = []
    for score in result.task_scores:
        other = base_scores.get((score.task, score.metric))
        name = f"{score.task}/{score.metric}"
        paired = mcnemar = None
        if other is not None and score.per_doc and len(score.per_doc) == len(other.per_doc):
            new, old = np.asarray(score.per_doc), np.asarray(other.per_doc)
            binary = set(np.unique(np.concatenate([new, old]))) <= {0.0, 1.0}
            if old.sum() > 0 and binary:  # % of the baseline's accuracy, the interval of the flips
                diff, scale = paired_binary_difference(old, new), 100.0 / old.mean()
                paired = PairedDelta(scale * diff.delta, scale * diff.ci_low, scale * diff.ci_high, diff.items)
            elif old.sum() > 0:
                paired = paired_ratio(new - old, old, transform=lambda x: 100.0 * x)
            if binary:
                mcnemar = mcnemar_exact(old, new)
        rows.append(_row(result.label, "lm-eval", name, score.value, None if other is None else other.value,
                         score.stderr, paired, mcnemar=mcnemar, items=len(score.per_doc) or score.samples))
    return rows


def _direct_rows(label: str, source: str, metrics: Sequence[DirectMetric]) -> list[MetricRow]:
    rows = []
    for m in metrics:
        if m.interval_of == "value":
            interval = None if m.delta.ci_low is None else (m.delta.ci_low, m.delta.ci_high)
            rows.append(_row(label, source, m.name, m.value, m.baseline, value_ci=interval, items=m.delta.items))
        else:
            row = _row(label, source, m.name, m.value, m.baseline, delta_pct=m.delta, mcnemar=m.mcnemar,
                       items=m.delta.items)
            # agreement measures drift, not quality: the "loss < 0.5%" claim is about perplexity and accuracy
            rows.append(dataclasses.replace(row, verdict=None) if m.name in DRIFT_ONLY else row)
    return rows


def _greedy_rows(label: str, g: GreedyStats) -> list[MetricRow]:
    # The baseline matches itself on every prompt, so every mismatch is a flip "right -> wrong".
    mcnemar = mcnemar_exact(np.ones(g.prompts), np.arange(g.prompts) < g.exact_matches)
    return [
        _row(label, "greedy", "greedy_exact_match", g.exact_match_rate, 1.0,
             _binomial_stderr(g.exact_match_rate, g.prompts), value_ci=proportion_ci(g.exact_matches, g.prompts),
             mcnemar=mcnemar, items=g.prompts),
        _row(label, "greedy", "greedy_first_diff_pos", g.mean_first_divergence, None),
        _row(label, "greedy", "greedy_matching_prefix", g.matching_prefix_rate, 1.0),
    ]


def _passkey_rows(result: SettingResult, base: SettingResult) -> list[MetricRow]:
    base_by_length = {outcome.length: outcome for outcome in base.passkey}
    rows = []
    for outcome in result.passkey:
        ref = base_by_length.get(outcome.length)
        hits = sum(outcome.retrieved)
        mcnemar = None if ref is None else mcnemar_exact(ref.retrieved, outcome.retrieved)
        rows.append(_row(result.label, "passkey", f"passkey@{outcome.length}", hits / len(outcome.retrieved),
                         None if ref is None else sum(ref.retrieved) / len(ref.retrieved),
                         value_ci=proportion_ci(hits, len(outcome.retrieved)), mcnemar=mcnemar,
                         items=len(outcome.retrieved)))
    return rows


def metric_rows(results: Sequence[SettingResult], baseline: str) -> list[MetricRow]:
    base = next(r for r in results if r.label == baseline)
    rows = []
    for result in results:
        rows += _task_rows(result, base)
        if result.direct:
            rows += _direct_rows(result.label, "direct", result.direct)
        elif result.divergence is not None:  # sums only (no per-position scores): no interval
            d, b = result.divergence, base.divergence
            rows.append(_row(result.label, "direct", "kl", d.kl, 0.0))
            rows.append(_row(result.label, "direct", "top1_agreement", d.top1_agreement, 1.0,
                             _binomial_stderr(d.top1_agreement, d.positions)))
            rows.append(_row(result.label, "direct", "perplexity", d.perplexity, None if b is None else b.perplexity))
        if result.greedy is not None:
            rows += _greedy_rows(result.label, result.greedy)
        rows += _passkey_rows(result, base)
    # the baseline against itself has nothing to judge
    return [dataclasses.replace(row, verdict=None) if row.setting == baseline else row for row in rows]


def position_rows(results: Sequence[SettingResult]) -> list[MetricRow]:
    """The direct measures per context-position bucket (source "pos A-B")."""
    rows = []
    for result in results:
        for low, high, metrics in result.positions:
            rows += _direct_rows(result.label, f"pos {low}-{high}", metrics)
    return rows


def headline_name(task: str) -> str:
    return f"{task}/{TASKS[task].headline}"


def aggregate_delta_pct(rows: Sequence[MetricRow], setting: str) -> float | None:
    """Mean signed % change of the tasks' headline metrics for `setting`; None without any task."""
    headlines = {headline_name(task) for task in TASKS}
    changes = [row.delta_pct for row in rows if row.setting == setting and row.name in headlines]
    if not changes or any(change is None for change in changes):
        return None
    return sum(changes) / len(changes)


DRIFT_ONLY = ("top1_agreement",)
SUMMARY_DIRECT = ("kl", "top1_agreement", "perplexity", "next_token_acc", "greedy_exact_match")


def summary_frame(results: Sequence[SettingResult], baseline: str) -> pd.DataFrame:
    """One row per setting: headline task scores, the aggregate delta %, direct measures and their deltas %."""
    rows = metric_rows(results, baseline)
    table = []
    for result in results:
        mine = {row.name: row for row in rows if row.setting == result.label and row.source != "passkey"}
        entry: dict[str, object] = {"kv_setting": result.label}
        for task in TASKS:
            if headline_name(task) in mine:
                entry[headline_name(task)] = mine[headline_name(task)].value
        entry["aggregate_delta_pct"] = aggregate_delta_pct(rows, result.label)
        for name in SUMMARY_DIRECT:
            if name in mine:
                entry[name] = mine[name].value
        if "perplexity" in mine:
            entry["perplexity_delta_pct"] = mine["perplexity"].delta_pct
        table.append(entry)
    return pd.DataFrame(table)


def claims_frame(rows: Sequence[MetricRow], baseline: str) -> pd.DataFrame:
    """Every delta with an interval, for the settings against the baseline: what the run can resolve."""
    picked = [row for row in rows if row.setting != baseline and row.ci_of == "delta_pct"]
    return pd.DataFrame([{
        "setting": row.setting, "source": row.source, "metric": row.name, "value": row.value,
        "baseline": row.baseline, "delta_pct": row.delta_pct, "ci_low": row.ci_low, "ci_high": row.ci_high,
        "detectable_pct": (row.ci_high - row.ci_low) / 2.0, "p_mcnemar": row.p_value, "items": row.items,
        "items_for_claim": items_for_claim(row), "verdict": row.verdict,
    } for row in picked])


def items_for_claim(row: MetricRow, claim_pct: float = CLAIM_PCT) -> int | None:
    """Items a run would need for this delta's interval half-width to reach `claim_pct` (half-width scales as
    1/sqrt(items) at the observed per-item variance); None without an interval."""
    if row.ci_low is None or row.ci_high is None or not row.items:
        return None
    half = (row.ci_high - row.ci_low) / 2.0
    return max(1, math.ceil(row.items * (half / claim_pct) ** 2))


def baseline_frame(results: Sequence[SettingResult], baseline: str) -> pd.DataFrame:
    """The baseline's own scores next to each task's chance level (a task at or below chance says nothing)."""
    base = next(r for r in results if r.label == baseline)
    out = []
    for score in base.task_scores:
        task = TASKS.get(score.task)
        if task is None or score.metric != task.headline:
            continue
        chance = task.chance
        above = None if chance is None else score.value > chance
        out.append({"task": score.task, "metric": score.metric, "baseline": score.value, "chance": chance,
                    "documents": score.samples, "above_chance": above})
    for outcome in base.passkey:
        out.append({"task": f"passkey@{outcome.length}", "metric": "retrieved", "baseline":
                    sum(outcome.retrieved) / len(outcome.retrieved), "chance": 0.0,
                    "documents": len(outcome.retrieved), "above_chance": any(outcome.retrieved)})
    return pd.DataFrame(out)


def eval_json(results: Sequence[SettingResult], baseline: str) -> dict:
    """What `kvbench compare` reads: every metric's value, plus the aggregate delta %, and each metric's
    direction (lm-eval's `higher_is_better` for lm-eval metrics, evals/directions.py for ours; None: unknown)."""
    rows = metric_rows(results, baseline)
    settings = []
    for result in results:
        metrics = {row.name: row.value for row in rows if row.setting == result.label}
        metrics["aggregate_delta_pct"] = aggregate_delta_pct(rows, result.label)
        lm_eval = {f"{score.task}/{score.metric}": score.higher_is_better for score in result.task_scores}
        directions = {name: higher_is_better(name, lm_eval) for name in metrics}
        settings.append({"kv_setting": result.label, "metrics": metrics, "higher_is_better": directions,
                         **({"refused": result.refused} if result.refused else {})})
    return {"baseline": baseline, "settings": settings}


def write_tables(results: Sequence[SettingResult], baseline: str, run_dir: Path,
                 notes: Mapping[str, str] | None = None, sections: Sequence[str] = ()) -> dict[str, Path]:
    """Write eval.md, eval.csv, eval_summary.csv, eval.json (and eval_positions.png when there are position
    buckets) into `run_dir`; `sections` are extra markdown blocks placed before "Every metric"."""
    run_dir.mkdir(parents=True, exist_ok=True)
    all_rows = metric_rows(results, baseline)
    positions = position_rows(results)
    rows = pd.DataFrame([row.__dict__ for row in all_rows + positions])
    summary = summary_frame(results, baseline)
    paths = {name: run_dir / name for name in (EVAL_MD, EVAL_CSV, EVAL_SUMMARY_CSV, EVAL_JSON)}
    rows.to_csv(paths[EVAL_CSV], index=False)
    summary.to_csv(paths[EVAL_SUMMARY_CSV], index=False)
    paths[EVAL_JSON].write_text(json.dumps(eval_json(results, baseline), indent=2))
    lines = [f"# KV quality eval (baseline: {baseline})", ""]
    lines += [f"- {key}: {value}" for key, value in (notes or {}).items()]
    lines += ["", "## Summary", "", _markdown(summary, _summary_format), ""]
    refused = [r for r in results if r.refused]
    if refused:
        lines += ["## Settings the engine refused", "", "Nothing was measured for them; the reason is the engine's.",
                  "", *[f"- {r.label}: {r.refused}" for r in refused], ""]
    base_table = baseline_frame(results, baseline)
    if not base_table.empty:
        lines += ["## The baseline's own scores", "", "A task whose baseline is at or below chance cannot show a "
                  "loss; passkey lengths where the baseline fails are not run for the other settings.", "",
                  _markdown(base_table, _row_format), ""]
    claims = claims_frame(all_rows, baseline)
    if not claims.empty:
        lines += [f"## Paired deltas with 95% intervals (the claim tested: loss < {CLAIM_PCT:g}%)", "",
                  "delta % is signed (negative = worse). `detectable_pct` is the interval's half-width: roughly the "
                  "smallest change this run can tell from zero; `items_for_claim`: the items a run needs for a half-width of "
                  f"{CLAIM_PCT:g}% at the observed per-item variance. An interval wider than the claim reads "
                  "'cannot resolve', never 'no loss'. p_mcnemar: exact test on items that flipped.", "",
                  _markdown(claims, _row_format), ""]
    if positions:
        paths[EVAL_POSITIONS_PNG] = run_dir / EVAL_POSITIONS_PNG
        from kvbench.evals.plots import position_plot

        position_plot(positions, paths[EVAL_POSITIONS_PNG])
        frame = pd.DataFrame([row.__dict__ for row in positions])
        lines += ["## By context position (tokens already seen)", "", f"![positions]({EVAL_POSITIONS_PNG})", "",
                  _markdown(frame[["setting", "source", "name", "value", "delta_pct", "ci_low", "ci_high", "ci_of",
                                   "items"]], _row_format), ""]
    lines += list(sections)
    lines += ["## Every metric", "",
              "delta % is signed: negative = worse than the baseline (perplexity and KL: lower is better). ci_low/"
              "ci_high bound `ci_of` (the delta % where there is one, else the value).", "",
              _markdown(rows, _row_format), ""]
    paths[EVAL_MD].write_text("\n".join(lines))
    return paths


def _summary_format(column: str, value: object) -> str:
    if column in ("top1_agreement", "greedy_exact_match", "next_token_acc") or column.endswith("/acc") \
            or column.endswith("/acc_norm") or column.endswith("/exact_match"):
        return f"{100 * value:.1f}%"
    if column.endswith("_pct"):
        return f"{value:+.2f}%"
    if column == "kl":
        return f"{value:.2e}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_cell(column: str, value: object) -> str:
    """One cell of the summary table as eval.md writes it (the console prints the same text)."""
    return _summary_format(column, value)


def _row_format(column: str, value: object) -> str:
    if column in ("delta_pct", "detectable_pct"):
        return f"{value:+.2f}%" if column == "delta_pct" else f"{value:.2f}%"
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


def layer_frames(errors: Sequence) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (setting, K/V): mean and worst relative error with the worst (layer, head) and the largest outlier
    ratio; and per (dtype, K/V, layer): tensor-scale error over channel-scale error (> 1: channel scales help)."""
    frame = pd.DataFrame([e.__dict__ for e in errors])
    if frame.empty:
        return frame, frame
    rows = []
    for (setting, tensor), group in frame.groupby(["setting", "tensor"], sort=False):
        worst = group.loc[group["rel_error"].idxmax()]
        peak = group.loc[group["outlier"].idxmax()]
        rows.append({"setting": setting, "tensor": tensor, "mean_rel_error": group["rel_error"].mean(),
                     "worst_rel_error": worst["rel_error"], "worst_at": f"layer {worst['layer']} head {worst['head']}",
                     "max_outlier": peak["outlier"], "outlier_at": f"layer {peak['layer']} head {peak['head']}"})
    frame["dtype"] = frame["setting"].str.split("/").str[0]
    frame["scale"] = frame["setting"].str.split("/").str[1]
    per_layer = (frame.rename(columns={"tensor": "kv"}).groupby(["dtype", "kv", "layer", "scale"])["rel_error"]
                 .mean().unstack("scale"))
    gains = pd.DataFrame()
    if {"tensor", "channel"} <= set(per_layer.columns):
        per_layer = per_layer[["tensor", "channel"]].rename(columns={"tensor": "tensor_scale_err",
                                                                     "channel": "channel_scale_err"}).reset_index()
        per_layer["tensor_over_channel"] = per_layer["tensor_scale_err"] / per_layer["channel_scale_err"]
        gains = per_layer.sort_values("tensor_over_channel", ascending=False).groupby(["dtype", "kv"]).head(3)
    return pd.DataFrame(rows), gains


def write_layer_profile(errors: Sequence, run_dir: Path) -> str:
    """eval_layers.csv and eval_layers.png; returns the markdown section for eval.md."""
    from kvbench.evals.plots import layer_plot
    from kvbench.measure.run_folder import EVAL_LAYERS_CSV, EVAL_LAYERS_PNG

    frame = pd.DataFrame([e.__dict__ for e in errors])
    if frame.empty:
        return ""
    frame.to_csv(run_dir / EVAL_LAYERS_CSV, index=False)
    maps = {}
    for (setting, tensor), group in frame.groupby(["setting", "tensor"], sort=False):
        maps[f"{setting} {tensor}"] = group.pivot(index="layer", columns="head", values="rel_error").to_numpy()
    layer_plot(maps, run_dir / EVAL_LAYERS_PNG, "Relative K/V quantisation error per layer (rows) and KV head")
    summary, gains = layer_frames(errors)
    lines = ["## Where the quantisation error lives (per layer and KV head)", "",
             f"![layers]({EVAL_LAYERS_PNG}) (every value: {EVAL_LAYERS_CSV}). rel_error = ||decoded - exact|| / "
             "||exact|| over one window of real text; outlier = max|x| / rms(x) of the head.", "",
             _markdown(summary, _row_format), ""]
    if not gains.empty:
        lines += ["Layers that gain most from channel scales (mean over heads; tensor-scale error / channel-scale "
                  "error):", "", _markdown(gains.reset_index(drop=True), _row_format), ""]
    return "\n".join(lines)


def write_tradeoff(frame: pd.DataFrame, run_dir: Path, source: Path) -> str:
    """eval_tradeoff.csv/.md/.png from `tradeoff.tradeoff_frame`; returns the markdown section for eval.md."""
    from kvbench.evals.plots import tradeoff_plot
    from kvbench.measure.run_folder import EVAL_TRADEOFF_CSV, EVAL_TRADEOFF_MD, EVAL_TRADEOFF_PNG

    frame.to_csv(run_dir / EVAL_TRADEOFF_CSV, index=False)
    tradeoff_plot(frame.to_dict("records"), run_dir / EVAL_TRADEOFF_PNG)
    shown = frame.copy()
    for prefix in [c[: -len("_delta_pct")] for c in frame.columns if c.endswith("_delta_pct")]:
        shown[f"{prefix} delta % [95% CI]"] = [
            _with_interval(d, lo, hi) for d, lo, hi in zip(frame[f"{prefix}_delta_pct"], frame[f"{prefix}_ci_low"],
                                                           frame[f"{prefix}_ci_high"])]
        shown = shown.drop(columns=[f"{prefix}_delta_pct", f"{prefix}_ci_low", f"{prefix}_ci_high"])
    section = "\n".join([
        "## Quality beside performance", "",
        f"Performance from the `kvbench run` folder {source} (mean over its valid points per KV setting), quality "
        f"from this eval. ![tradeoff]({EVAL_TRADEOFF_PNG})", "", _markdown(shown, _tradeoff_format), ""])
    (run_dir / EVAL_TRADEOFF_MD).write_text(section)
    return section


def _with_interval(delta, low, high) -> str:
    if delta is None or (isinstance(delta, float) and math.isnan(delta)):
        return "n/a"
    if low is None or high is None or (isinstance(low, float) and math.isnan(low)):
        return f"{delta:+.2f}%"
    return f"{delta:+.2f}% [{low:+.2f}, {high:+.2f}]"


def _tradeoff_format(column: str, value: object) -> str:
    if column.endswith("_rate") or column == "top1_agreement":
        return f"{100 * value:.1f}%"
    if column == "kl":
        return f"{value:.2e}"
    return f"{value:.1f}" if isinstance(value, float) else str(value)
