"""The eval's files (evals/results.py lists them): eval.md, eval.csv, eval_summary.csv and eval.json from one run's
results, and the layer-profile and quality-beside-performance sections. Tables only lay out what
`evals/results.py` computes; missing values print as n/a, never as 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from kvbench.evals.paired import CLAIM_PCT
from kvbench.evals.result_frames import baseline_frame, claims_frame, layer_frames, summary_frame
from kvbench.evals.results import SettingResult, eval_json, metric_rows, position_rows
from kvbench.measure.run_folder import EVAL_CSV, EVAL_JSON, EVAL_MD, EVAL_POSITIONS_PNG, EVAL_SUMMARY_CSV


def write_tables(
    results: Sequence[SettingResult],
    baseline: str,
    run_dir: Path,
    notes: Mapping[str, str] | None = None,
    sections: Sequence[str] = (),
) -> dict[str, Path]:
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
    lines += _refused_section(results)
    lines += _frame_section(
        "The baseline's own scores",
        "A task whose baseline is at or below chance cannot show a "
        "loss; passkey lengths where the baseline fails are not run for the other settings.",
        baseline_frame(results, baseline),
    )
    lines += _frame_section(
        f"Paired deltas with 95% intervals (the claim tested: loss < {CLAIM_PCT:g}%)",
        "delta % is signed (negative = worse). `detectable_pct` is the interval's half-width: roughly the "
        "smallest change this run can tell from zero; `items_for_claim`: the items a run needs for a half-width of "
        f"{CLAIM_PCT:g}% at the observed per-item variance. An interval wider than the claim reads "
        "'cannot resolve', never 'no loss'. p_mcnemar: exact test on items that flipped.",
        claims_frame(all_rows, baseline),
    )
    if positions:
        paths[EVAL_POSITIONS_PNG] = run_dir / EVAL_POSITIONS_PNG
        lines += _positions_section(positions, paths[EVAL_POSITIONS_PNG])
    lines += list(sections)
    lines += _section(
        "Every metric",
        "delta % is signed: negative = worse than the baseline (perplexity and KL: lower is better). ci_low/"
        "ci_high bound `ci_of` (the delta % where there is one, else the value).",
        _markdown(rows, _row_format),
    )
    paths[EVAL_MD].write_text("\n".join(lines))
    return paths


def _section(title: str, note: str, body: str) -> list[str]:
    """A markdown section of eval.md: its heading, a note on how to read it, and its body."""
    return [f"## {title}", "", note, "", body, ""]


def _frame_section(title: str, note: str, frame: pd.DataFrame) -> list[str]:
    """A section holding one table; none when the table is empty (that part was not run)."""
    return [] if frame.empty else _section(title, note, _markdown(frame, _row_format))


def _refused_section(results: Sequence[SettingResult]) -> list[str]:
    refused = [r for r in results if r.refused]
    if not refused:
        return []
    reasons = "\n".join(f"- {r.label}: {r.refused}" for r in refused)
    return _section(
        "Settings the engine refused", "Nothing was measured for them; the reason is the engine's.", reasons
    )


def _positions_section(positions: Sequence, plot: Path) -> list[str]:
    """The direct measures per context-position bucket, with their plot (written to `plot`)."""
    from kvbench.evals.plots import position_plot

    position_plot(positions, plot)
    frame = pd.DataFrame([row.__dict__ for row in positions])
    columns = ["setting", "source", "name", "value", "delta_pct", "ci_low", "ci_high", "ci_of", "items"]
    return _section(
        "By context position (tokens already seen)",
        f"![positions]({plot.name})",
        _markdown(frame[columns], _row_format),
    )


def _summary_format(column: str, value: object) -> str:
    if (
        column in ("top1_agreement", "greedy_exact_match", "next_token_acc")
        or column.endswith("/acc")
        or column.endswith("/acc_norm")
        or column.endswith("/exact_match")
    ):
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
        cells = [
            "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt(column, value)
            for column, value in row.items()
        ]
        body.append("| " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *body])


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
    lines = [
        "## Where the quantisation error lives (per layer and KV head)",
        "",
        f"![layers]({EVAL_LAYERS_PNG}) (every value: {EVAL_LAYERS_CSV}). rel_error = ||decoded - exact|| / "
        "||exact|| over one window of real text; outlier = max|x| / rms(x) of the head.",
        "",
        _markdown(summary, _row_format),
        "",
    ]
    if not gains.empty:
        lines += [
            "Layers that gain most from channel scales (mean over heads; tensor-scale error / channel-scale error):",
            "",
            _markdown(gains.reset_index(drop=True), _row_format),
            "",
        ]
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
            _with_interval(d, lo, hi)
            for d, lo, hi in zip(frame[f"{prefix}_delta_pct"], frame[f"{prefix}_ci_low"], frame[f"{prefix}_ci_high"])
        ]
        shown = shown.drop(columns=[f"{prefix}_delta_pct", f"{prefix}_ci_low", f"{prefix}_ci_high"])
    section = "\n".join(
        [
            "## Quality beside performance",
            "",
            f"Performance from the `kvbench run` folder {source} (mean over its valid points per KV setting), quality "
            f"from this eval. ![tradeoff]({EVAL_TRADEOFF_PNG})",
            "",
            _markdown(shown, _tradeoff_format),
            "",
        ]
    )
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
