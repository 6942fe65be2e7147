"""Result files of a run folder: summary.csv/md and PNG plots. Formats numbers; computes no metrics.

A run folder holds one entry per measured point (engine setting x workload x load point x repetition). Each
entry carries its `RunSummary.to_dict()`; the tables flatten it into one row per (point, tenant), tenant `all`
being the total. An entry with `valid` false names why in `invalid_reasons`; summary.md lists them under
Flags and summary.csv joins them in its `invalid_reasons` column. The file names are `run_folder.py`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.distribution import PERCENTILES
from kvbench.measure.flags import WARM_CACHE, folder_flags
from kvbench.measure.run_folder import (
    SUMMARY_CSV,
    SUMMARY_MD,
    THROUGHPUT_PNG,
    TTFT_CDF_PNG,
    RunEntry,
    replace_file,
    write_entries,
)
from kvbench.measure.write_errors import writing

# The columns every summary.csv has, in this order (issue 2's contract), then a few more.
COLUMNS = [
    "engine",
    "kv_dtype",
    "workload",
    "load",
    "tenant",
    "requests",
    "errors",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_p50_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "output_tok_s",
    "total_tok_s",
    "req_s",
    "goodput_req_s",
    "cache_hit_rate",
    "oracle_hit_rate",
    "prefill_recompute_rate",
]
# TTFT/E2E from the planned send time (coordinated-omission aware): apart from TTFT/E2E when the client or a
# closed loop held requests back.
SCHEDULE_COLUMNS = [
    "ttft_from_schedule_p50_ms",
    "ttft_from_schedule_p99_ms",
    "e2e_from_schedule_p50_ms",
    "e2e_from_schedule_p99_ms",
]
# Every percentile a summary holds for each request metric, for `--percentile-metrics`/`--metric-percentiles`.
PERCENTILE_COLUMNS = [f"{metric}_p{p}_ms" for metric in ("ttft", "tpot", "itl", "e2e") for p in PERCENTILES]
# Goodput's SLO attainment: the share of measured requests meeting every SLO (None without an SLO).
GOODPUT_COLUMNS = ["goodput_req_s", "slo_attainment"]
EXTRA_COLUMNS = [
    *SCHEDULE_COLUMNS,
    "slo_attainment",
    *(column for column in PERCENTILE_COLUMNS if column not in COLUMNS),
    "cache",
    "run_id",
    "repeat",
    "valid",
    "server_cached_tokens",
    "reconciled",
    "ttft_fairness_jain",
    "invalid_reasons",
]
MD_COLUMNS = [
    "engine",
    "kv_dtype",
    "workload",
    "load",
    "cache",
    "tenant",
    "requests",
    "errors",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "ttft_from_schedule_p99_ms",
    "itl_p50_ms",
    "tpot_p50_ms",
    "output_tok_s",
    "cache_hit_rate",
    "oracle_hit_rate",
    "prefill_recompute_rate",
]


def summary_rows(entries: Iterable[RunEntry]) -> list[dict]:
    rows = []
    for entry in entries:
        summary = entry.summary
        groups = [summary["overall"]] + (list(summary["per_tenant"]) if len(summary["per_tenant"]) > 1 else [])
        for group in groups:
            rows.append(_row(entry, group, summary.get("ttft_fairness_jain")))
    return rows


def _row(entry: RunEntry, group: Mapping, fairness: float | None) -> dict:
    cache = group["cache"]
    reconciliation = entry.reconciliation or {}
    return {
        "engine": entry.engine,
        "kv_dtype": entry.kv_dtype,
        "workload": entry.workload,
        "load": entry.load,
        "tenant": group["tenant"],
        "requests": group["requests"],
        "errors": group["errors"],
        "ttft_p50_ms": _pick(group, "ttft_ms", "p50"),
        "ttft_p90_ms": _pick(group, "ttft_ms", "p90"),
        "ttft_p99_ms": _pick(group, "ttft_ms", "p99"),
        "itl_p50_ms": _pick(group, "itl_ms", "p50"),
        "itl_p99_ms": _pick(group, "itl_ms", "p99"),
        "tpot_p50_ms": _pick(group, "tpot_ms", "p50"),
        "e2e_p50_ms": _pick(group, "e2e_ms", "p50"),
        "e2e_p99_ms": _pick(group, "e2e_ms", "p99"),
        "ttft_from_schedule_p50_ms": _pick(group, "ttft_from_schedule_ms", "p50"),
        "ttft_from_schedule_p99_ms": _pick(group, "ttft_from_schedule_ms", "p99"),
        "e2e_from_schedule_p50_ms": _pick(group, "e2e_from_schedule_ms", "p50"),
        "e2e_from_schedule_p99_ms": _pick(group, "e2e_from_schedule_ms", "p99"),
        "output_tok_s": group["output_tok_s"],
        "total_tok_s": group["total_tok_s"],
        "req_s": group["req_s"],
        "goodput_req_s": group["goodput_req_s"],
        "slo_attainment": group.get("slo_attainment"),
        **{
            f"{metric}_p{p}_ms": _pick(group, f"{metric}_ms", f"p{p}")
            for metric in ("ttft", "tpot", "itl", "e2e")
            for p in PERCENTILES
        },
        "cache_hit_rate": cache["cache_hit_rate"],
        "oracle_hit_rate": cache["oracle_hit_rate"],
        "prefill_recompute_rate": cache["prefill_recompute_rate"],
        "cache": entry.cache_state,  # "warm cache": not reset before the point
        "run_id": entry.run_id,
        "repeat": entry.repeat,
        "valid": entry.valid,
        "server_cached_tokens": reconciliation.get("server_cached_tokens") if group["tenant"] == "all" else None,
        "reconciled": reconciliation.get("agree") if group["tenant"] == "all" else None,
        "ttft_fairness_jain": fairness if group["tenant"] == "all" else None,
        "invalid_reasons": "; ".join(entry.invalid_reasons) or None,
    }


def _pick(group: Mapping, metric: str, stat: str) -> float | None:
    value = group.get(metric)
    return value[stat] if value else None


def summary_frame(entries: Iterable[RunEntry]) -> pd.DataFrame:
    return pd.DataFrame(summary_rows(entries), columns=COLUMNS + EXTRA_COLUMNS)


def md_columns(frame: pd.DataFrame) -> list[str]:
    """summary.md's columns: `MD_COLUMNS`, and goodput beside throughput when an SLO was given."""
    if frame["goodput_req_s"].notna().any():
        at = MD_COLUMNS.index("output_tok_s") + 1
        return [*MD_COLUMNS[:at], *GOODPUT_COLUMNS, *MD_COLUMNS[at:]]
    return list(MD_COLUMNS)


def format_value(column: str, value, float_digits: int = 2) -> str:
    """One summary cell as text, the same in summary.md, the console and the HTML report: rates as percent,
    floats to `float_digits`, missing as n/a (never 0)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    if column.endswith("_rate") or column == "slo_attainment":
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.{float_digits}f}"
    return str(value)


def markdown_table(frame: pd.DataFrame, columns: Sequence[str] = MD_COLUMNS) -> str:
    shown = frame[list(columns)].astype(object)
    for column in shown.columns:
        shown[column] = shown[column].map(lambda v, c=column: format_value(c, v))
    return shown.to_markdown(index=False)


def write_summaries(run_dir: Path, entries: Sequence[RunEntry], notes: Sequence[str] = ()) -> pd.DataFrame:
    """(Re)write summary.json, summary.csv and summary.md from all entries so far.

    Each file is replaced whole (written beside, then renamed), so a run killed meanwhile leaves the
    previous version, never half a file.
    """
    write_entries(run_dir, entries, notes)
    frame = summary_frame(entries)
    replace_file(run_dir / SUMMARY_CSV, frame.to_csv(index=False))
    lines = [
        f"# kvbench results: {run_dir.name}",
        "",
        "Percentiles use linear interpolation (numpy's default, as vLLM's and SGLang's benchmarks). "
        "Rates: cache_hit_rate = cached/prompt tokens (server usage); oracle_hit_rate = reusable/prompt "
        "tokens (an unbounded cache); prefill_recompute_rate = reusable prefill the engine computed again.",
        "",
        markdown_table(frame, md_columns(frame)),
        "",
    ]
    flags = [
        f"- `{flag.run_id}`: {flag.text}" if flag.run_id else f"- {flag.text}" for flag in folder_flags(entries, notes)
    ]
    if flags:
        lines += ["## Flags", "", *flags, ""]
    replace_file(run_dir / SUMMARY_MD, "\n".join(lines))
    return frame


def write_overlay_cdf(path: Path, samples: Mapping[str, Sequence[float]], title: str) -> Path:
    """TTFT CDFs of several runs on one axis (`kvbench report --format html` over several folders)."""
    with _figure(path, "TTFT (ms)", "fraction of requests", title) as axis:
        draw_cdfs(axis, samples)
    return path


def write_plots(
    run_dir: Path, entries: Sequence[RunEntry], ttft_by_setting: Mapping[str, Sequence[float]]
) -> list[Path]:
    """TTFT CDF per engine setting, and throughput vs TTFT p99 across load points. Returns the files."""
    written = []
    warm = f" ({WARM_CACHE})" if any(entry.cache_state == WARM_CACHE for entry in entries) else ""
    if ttft_by_setting:
        with _figure(
            run_dir / TTFT_CDF_PNG, "TTFT (ms)", "fraction of requests", f"TTFT CDF per engine setting{warm}"
        ) as axis:
            draw_cdfs(axis, ttft_by_setting)
        written.append(run_dir / TTFT_CDF_PNG)
    frame = summary_frame(entries)
    overall = frame[frame["tenant"] == "all"]
    if not overall.empty:
        path = run_dir / THROUGHPUT_PNG
        with _figure(
            path, "output tokens/s", "TTFT p99 (ms)", f"Throughput vs TTFT p99 across load points{warm}"
        ) as axis:
            draw_throughput_points(axis, overall)
        written.append(path)
    return written


_STYLES = ("-", "--", "-.", ":")


def same_samples(samples: Mapping[str, Sequence[float]]) -> list[tuple[str, np.ndarray]]:
    """(label, sorted sample) per distinct sample: settings whose samples are identical share one curve,
    labelled `a = b` (four identical curves drawn over each other read as one unlabelled line)."""
    groups: list[tuple[list[str], np.ndarray]] = []
    for label, values in samples.items():
        ordered = np.sort(np.asarray(values, dtype=np.float64))
        if not ordered.size:
            continue
        for labels, other in groups:
            if other.shape == ordered.shape and np.allclose(other, ordered, rtol=1e-9, atol=0.0):
                labels.append(label)
                break
        else:
            groups.append(([label], ordered))
    return [(" = ".join(labels), ordered) for labels, ordered in groups]


def draw_cdfs(axis, samples: Mapping[str, Sequence[float]]) -> None:
    """One step CDF per distinct sample (see `same_samples`), each in its own line style too, so curves that
    nearly coincide stay apart; the x axis is logarithmic when the samples span more than 20x."""
    curves = same_samples(samples)
    for index, (label, ordered) in enumerate(curves):
        axis.step(
            ordered,
            np.arange(1, ordered.size + 1) / ordered.size,
            where="post",
            label=label,
            linestyle=_STYLES[index % len(_STYLES)],
            linewidth=2.2 - 0.3 * (index % 4),
        )
    positive = [ordered[ordered > 0] for _, ordered in curves]
    low = min((values.min() for values in positive if values.size), default=None)
    high = max((values.max() for values in positive if values.size), default=None)
    if low is not None and high > 20 * low:
        axis.set_xscale("log")


def draw_throughput_points(axis, overall: pd.DataFrame) -> None:
    """One line per (engine setting, workload) through its load points, in throughput order, each point
    labelled with its load (and, for a setting with one point, its engine), so a single point is not an
    anonymous dot."""
    for (engine, workload), group in overall.groupby(["engine", "workload"]):
        group = group.dropna(subset=["output_tok_s", "ttft_p99_ms"]).sort_values("output_tok_s")
        if group.empty:
            continue
        axis.plot(group["output_tok_s"], group["ttft_p99_ms"], marker="o", label=f"{engine} / {workload}")
        for _, row in group.iterrows():
            text = row["load"] if len(group) > 1 else f"{engine} {row['load']}"
            axis.annotate(
                str(text),
                (row["output_tok_s"], row["ttft_p99_ms"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )


@contextlib.contextmanager
def _figure(path: Path, xlabel: str, ylabel: str, title: str):
    """A labelled matplotlib axis, saved to `path` as PNG when the block ends. A bare Figure on the Agg canvas,
    not pyplot: pyplot's import and its figure manager were a third of a small run's post-processing, and a
    Figure needs no closing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="tight")
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    yield axis
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:  # nothing to label when no request succeeded
        axis.legend(fontsize=7)
    with writing(path):
        figure.savefig(path, dpi=110)
