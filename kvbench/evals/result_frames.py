"""The eval's tables as pandas frames, built from `results.py`'s metric rows and computing nothing new: one row
per setting (headline scores, the aggregate delta %), the claims the run can resolve (with the items a claim
would need), the baseline against each task's chance level, and the per-layer KV error profile. `report.py`
writes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from kvbench.evals.paired import CLAIM_PCT
from kvbench.evals.results import MetricRow, SettingResult, aggregate_delta_pct, headline_name, metric_rows
from kvbench.evals.tasks import TASKS

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
    return pd.DataFrame(
        [
            {
                "setting": row.setting,
                "source": row.source,
                "metric": row.name,
                "value": row.value,
                "baseline": row.baseline,
                "delta_pct": row.delta_pct,
                "ci_low": row.ci_low,
                "ci_high": row.ci_high,
                "detectable_pct": (row.ci_high - row.ci_low) / 2.0,
                "p_mcnemar": row.p_value,
                "items": row.items,
                "items_for_claim": items_for_claim(row),
                "verdict": row.verdict,
            }
            for row in picked
        ]
    )


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
        out.append(
            {
                "task": score.task,
                "metric": score.metric,
                "baseline": score.value,
                "chance": chance,
                "documents": score.samples,
                "above_chance": above,
            }
        )
    for outcome in base.passkey:
        out.append(
            {
                "task": f"passkey@{outcome.length}",
                "metric": "retrieved",
                "baseline": sum(outcome.retrieved) / len(outcome.retrieved),
                "chance": 0.0,
                "documents": len(outcome.retrieved),
                "above_chance": any(outcome.retrieved),
            }
        )
    return pd.DataFrame(out)


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
        rows.append(
            {
                "setting": setting,
                "tensor": tensor,
                "mean_rel_error": group["rel_error"].mean(),
                "worst_rel_error": worst["rel_error"],
                "worst_at": f"layer {worst['layer']} head {worst['head']}",
                "max_outlier": peak["outlier"],
                "outlier_at": f"layer {peak['layer']} head {peak['head']}",
            }
        )
    frame["dtype"] = frame["setting"].str.split("/").str[0]
    frame["scale"] = frame["setting"].str.split("/").str[1]
    per_layer = (
        frame.rename(columns={"tensor": "kv"})
        .groupby(["dtype", "kv", "layer", "scale"])["rel_error"]
        .mean()
        .unstack("scale")
    )
    gains = pd.DataFrame()
    if {"tensor", "channel"} <= set(per_layer.columns):
        per_layer = (
            per_layer[["tensor", "channel"]]
            .rename(columns={"tensor": "tensor_scale_err", "channel": "channel_scale_err"})
            .reset_index()
        )
        per_layer["tensor_over_channel"] = per_layer["tensor_scale_err"] / per_layer["channel_scale_err"]
        gains = per_layer.sort_values("tensor_over_channel", ascending=False).groupby(["dtype", "kv"]).head(3)
    return pd.DataFrame(rows), gains
