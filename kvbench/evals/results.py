"""Eval results of one run: per-setting scores, paired deltas against the baseline with 95% intervals, and files.

    eval.md / eval.csv   one row per (setting, source, metric): value, stderr, baseline, delta, delta %, the
                         paired bootstrap interval (ci_low, ci_high of `ci_of`: the delta % where there is one,
                         else the value), McNemar's p for flips, the items paired, and the verdict on the
                         article's "loss < 0.5%" ("cannot resolve" when the interval is wider than that)
    eval_summary.csv     one row per setting: headline metrics and the aggregate delta %
    eval.json            {"settings": [{"kv_setting": label, "metrics": {name: value}, "higher_is_better":
                         {name: bool}}]} for `kvbench compare`
    eval_positions.png   KL, top-1 agreement and perplexity change per context-position bucket
    (written by evals/report.py)

Sources of rows: "lm-eval" (documents paired by doc_id), "direct" (blocks of positions, exact logits),
"pos A-B" (the same per context-position bucket), "greedy" (prompts), "passkey" (prompts per length).
Aggregate delta % (the article's "-0.3% aggregate"): the mean over tasks of each task's headline metric's
relative change, signed so that negative is a loss (accuracy new/base - 1; perplexity base/new - 1).
Computing here (the per-setting tables built from these rows: `evals/result_frames.py`); the files are written
by `evals/report.py`, whose table code only lays out what these return.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.evals.divergence import DivergenceStats, GreedyStats
from kvbench.evals.items import DirectMetric
from kvbench.evals.lm_eval_run import TaskScore
from kvbench.evals.paired import (
    McNemar,
    PairedDelta,
    mcnemar_exact,
    paired_binary_difference,
    paired_ratio,
    proportion_ci,
    verdict,
)
from kvbench.evals.tasks import TASKS
from kvbench.verdicts.directions import higher_is_better


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
    """From the metric's source (verdicts/directions.py); a metric no source declares counts as a score."""
    return higher_is_better(name) is False


def signed_change_pct(name: str, value: float | None, base: float | None) -> float | None:
    """Relative change in %, negative when quality got worse; None when undefined (missing or zero base)."""
    if value is None or base is None or base == 0 or value == 0 and _lower_is_better(name):
        return None
    change = base / value - 1.0 if _lower_is_better(name) else value / base - 1.0
    return 100.0 * change


def _binomial_stderr(p: float, n: int) -> float | None:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None


def _row(
    setting,
    source,
    name,
    value,
    base,
    stderr=None,
    delta_pct: PairedDelta | None = None,
    value_ci: tuple[float, float] | None = None,
    mcnemar: McNemar | None = None,
    items=None,
) -> MetricRow:
    delta = None if value is None or base is None else value - base
    pct = delta_pct.delta if delta_pct is not None else signed_change_pct(name, value, base)
    low = high = of = judged = None
    if delta_pct is not None and delta_pct.ci_low is not None:
        low, high, of = delta_pct.ci_low, delta_pct.ci_high, "delta_pct"
    elif value_ci is not None:
        low, high, of = value_ci[0], value_ci[1], "value"
    if delta_pct is not None:
        judged = verdict(delta_pct)
    return MetricRow(
        setting,
        source,
        name,
        value,
        stderr,
        base,
        delta,
        pct,
        low,
        high,
        of,
        None if mcnemar is None else mcnemar.p_value,
        items,
        judged,
    )


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
        rows.append(
            _row(
                result.label,
                "lm-eval",
                name,
                score.value,
                None if other is None else other.value,
                score.stderr,
                paired,
                mcnemar=mcnemar,
                items=len(score.per_doc) or score.samples,
            )
        )
    return rows


def _direct_rows(label: str, source: str, metrics: Sequence[DirectMetric]) -> list[MetricRow]:
    rows = []
    for m in metrics:
        if m.interval_of == "value":
            interval = None if m.delta.ci_low is None else (m.delta.ci_low, m.delta.ci_high)
            rows.append(_row(label, source, m.name, m.value, m.baseline, value_ci=interval, items=m.delta.items))
        else:
            row = _row(
                label, source, m.name, m.value, m.baseline, delta_pct=m.delta, mcnemar=m.mcnemar, items=m.delta.items
            )
            # agreement measures drift, not quality: the "loss < 0.5%" claim is about perplexity and accuracy
            rows.append(dataclasses.replace(row, verdict=None) if m.name in DRIFT_ONLY else row)
    return rows


def _greedy_rows(label: str, g: GreedyStats) -> list[MetricRow]:
    # The baseline matches itself on every prompt, so every mismatch is a flip "right -> wrong".
    mcnemar = mcnemar_exact(np.ones(g.prompts), np.arange(g.prompts) < g.exact_matches)
    return [
        _row(
            label,
            "greedy",
            "greedy_exact_match",
            g.exact_match_rate,
            1.0,
            _binomial_stderr(g.exact_match_rate, g.prompts),
            value_ci=proportion_ci(g.exact_matches, g.prompts),
            mcnemar=mcnemar,
            items=g.prompts,
        ),
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
        rows.append(
            _row(
                result.label,
                "passkey",
                f"passkey@{outcome.length}",
                hits / len(outcome.retrieved),
                None if ref is None else sum(ref.retrieved) / len(ref.retrieved),
                value_ci=proportion_ci(hits, len(outcome.retrieved)),
                mcnemar=mcnemar,
                items=len(outcome.retrieved),
            )
        )
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
            rows.append(
                _row(
                    result.label,
                    "direct",
                    "top1_agreement",
                    d.top1_agreement,
                    1.0,
                    _binomial_stderr(d.top1_agreement, d.positions),
                )
            )
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


def eval_json(results: Sequence[SettingResult], baseline: str) -> dict:
    """What `kvbench compare` reads: every metric's value, plus the aggregate delta %, and each metric's
    direction (lm-eval's `higher_is_better` for lm-eval metrics, verdicts/directions.py for ours; None: unknown)."""
    rows = metric_rows(results, baseline)
    settings = []
    for result in results:
        metrics = {row.name: row.value for row in rows if row.setting == result.label}
        metrics["aggregate_delta_pct"] = aggregate_delta_pct(rows, result.label)
        lm_eval = {f"{score.task}/{score.metric}": score.higher_is_better for score in result.task_scores}
        directions = {name: higher_is_better(name, lm_eval) for name in metrics}
        settings.append(
            {
                "kv_setting": result.label,
                "metrics": metrics,
                "higher_is_better": directions,
                **({"refused": result.refused} if result.refused else {}),
            }
        )
    return {"baseline": baseline, "settings": settings}
