"""The results table that `kvbench run` and `kvbench simulate` print from a run folder's summary, and the
line that names its result files."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape

console = Console()


SUMMARY_COLUMNS = {
    "engine": "engine",
    "kv_dtype": "kv",
    "workload": "workload",
    "load": "load",
    "cache": "cache",
    "tenant": "tenant",
    "requests": "req",
    "errors": "err",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "ttft_from_schedule_p99_ms": "sched. TTFT p99",
    "itl_p50_ms": "ITL p50 ms",
    "output_tok_s": "out tok/s",
    "cache_hit_rate": "hit",
    "oracle_hit_rate": "oracle",
    "prefill_recompute_rate": "recompute",
}


PERCENTILE_TITLES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms")  # SUMMARY_COLUMNS' own percentile columns
GOODPUT_TITLES = {"goodput_req_s": "goodput req/s", "slo_attainment": "SLO met"}


def summary_columns(frame, percentiles: dict[str, str] | None = None) -> dict[str, str]:
    """The table's columns: SUMMARY_COLUMNS with `percentiles` (column -> title) in place of its own when given,
    and goodput beside throughput when the run had an SLO."""
    columns: dict[str, str] = {}
    for column, title in SUMMARY_COLUMNS.items():
        if percentiles is not None and column in PERCENTILE_TITLES:
            if column == PERCENTILE_TITLES[0]:
                columns.update(percentiles)
            continue
        columns[column] = title
        if column == "output_tok_s" and frame["goodput_req_s"].notna().any():
            columns.update(GOODPUT_TITLES)
    return columns


def print_summary(run_dir: Path, percentiles: dict[str, str] | None = None):
    """Print the run folder's results table (`percentiles`: column -> title of the percentiles to show, default
    TTFT p50/p99 and ITL p50); returns the summary frame it printed (for `print_tradeoff`)."""
    from kvbench.measure.extra_percentiles import add_percentiles
    from kvbench.measure.report import summary_frame
    from kvbench.measure.run_folder import read_entries

    frame = summary_frame(read_entries(run_dir))
    if percentiles is not None and any(column not in frame for column in percentiles):
        frame = add_percentiles(frame, _request_rows(run_dir), list(percentiles))
    print_frame(_wide(), frame, summary_columns(frame, percentiles))
    return frame


def _request_rows(run_dir: Path) -> list[dict]:
    """The per-request export's rows (none where the run wrote none: those percentiles are then n/a)."""
    import json

    from kvbench.measure.run_folder import REQUESTS_METRICS_JSONL

    path = run_dir / REQUESTS_METRICS_JSONL
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def wide_console() -> Console:
    """The console tables print on (see `_wide`)."""
    return _wide()


def _wide() -> Console:
    """The terminal's width; not a terminal (CI logs, pipes): COLUMNS where it is set, else 200 (rich would wrap
    at 80 columns and cut every cell)."""
    if console.is_terminal:
        return console
    return Console() if os.environ.get("COLUMNS", "").isdigit() else Console(width=200)  # Console() reads COLUMNS


def print_tradeoff(frame, baseline: str, other: str, same: str) -> None:
    """One line under the table: what `other` changed against `baseline` (engine labels of the summary `frame`)
    in `same` resources."""
    rows = frame[frame["tenant"] == "all"].set_index("engine")
    if baseline not in rows.index or other not in rows.index:
        return
    a, b = rows.loc[baseline], rows.loc[other]
    changes = ", ".join(
        f"{title} {_fmt(column, a[column])} -> {_fmt(column, b[column])}" for column, title in TRADEOFF_COLUMNS.items()
    )
    _wide().print(f"{escape(other)} against {escape(baseline)} in {same}: {changes}", highlight=False)


TRADEOFF_COLUMNS = {
    "cache_hit_rate": "cache hit",
    "prefill_recompute_rate": "prefill recompute",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "output_tok_s": "out tok/s",
}


def print_flags(console: Console, run_dir: Path) -> list:
    """Print the flags summary.json holds (`measure/flags.py`: the list summary.md and the HTML report show),
    an invalid point's and a failure's in red; returns them."""
    from kvbench.measure.flags import folder_flags, read_notes
    from kvbench.measure.run_folder import SUMMARY_JSON, read_entries

    flags = folder_flags(read_entries(run_dir), read_notes(run_dir / SUMMARY_JSON))
    for flag in flags:
        style = "bold red" if flag.invalid or flag.run_id is None else "bold yellow"
        where = f"{escape(flag.run_id)}: " if flag.run_id else ""
        console.print(f"[{style}]flag:[/{style}] {where}{escape(flag.text)}", highlight=False)
    return flags


def results_line(run_dir: Path) -> str:
    from kvbench.measure.run_folder import (
        LLMD_RESULTS_DIR,
        REQUESTS_JSONL,
        REQUESTS_METRICS_JSONL,
        SUMMARY_CSV,
        SUMMARY_JSON,
        SUMMARY_MD,
        VLLM_RESULTS_DIR,
    )

    exports = (
        f", {REQUESTS_METRICS_JSONL}, {VLLM_RESULTS_DIR}/, {LLMD_RESULTS_DIR}/"
        if (run_dir / REQUESTS_METRICS_JSONL).exists()
        else ""
    )
    return f"results: {run_dir}/{SUMMARY_MD}, {SUMMARY_CSV}, {SUMMARY_JSON}, {REQUESTS_JSONL}{exports}"


def print_frame(console: Console, frame, columns: dict[str, str], keys: int = 1, title: str | None = None) -> None:
    """`frame`'s `columns` (column -> title) in kvbench's one table style (cli/console_table.py): numbers never
    cut, the first `keys` columns repeated when the table is printed in parts."""
    from kvbench.cli.console_table import Column, print_table

    numeric = {column: frame[column].dtype.kind in "fi" or column.endswith("_rate") for column in columns}
    rows = [[_fmt(column, row[column]) for column in columns] for _, row in frame[list(columns)].iterrows()]
    print_table(console, [Column(title, numeric[column]) for column, title in columns.items()], rows, keys, title)


def _fmt(column: str, value) -> str:
    from kvbench.measure.report import format_value

    return escape(format_value(column, value, float_digits=1))  # labels like kvengine[kv_dtype=fp8] are not markup
