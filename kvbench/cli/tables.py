"""The results table that `kvbench run` and `kvbench simulate` print from a run folder's summary, and the
line that names its result files."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


SUMMARY_COLUMNS = {
    "engine": "engine", "kv_dtype": "kv", "workload": "workload", "load": "load", "cache": "cache", "tenant": "tenant",
    "requests": "req", "errors": "err", "ttft_p50_ms": "TTFT p50 ms", "ttft_p99_ms": "TTFT p99 ms",
    "ttft_from_schedule_p99_ms": "sched. TTFT p99", "itl_p50_ms": "ITL p50 ms", "output_tok_s": "out tok/s", "cache_hit_rate": "hit",
    "oracle_hit_rate": "oracle", "prefill_recompute_rate": "recompute",
}


def print_summary(run_dir: Path):
    """Print the run folder's results table; returns the summary frame it printed (for `print_tradeoff`)."""
    from kvbench.measure.report import summary_frame
    from kvbench.measure.run_folder import read_entries

    frame = summary_frame(read_entries(run_dir))
    _wide().print(frame_table(frame, SUMMARY_COLUMNS))
    return frame


def _wide() -> Console:
    """Not a terminal (CI logs, pipes): rich would wrap at 80 columns and cut every cell."""
    return console if console.is_terminal else Console(width=200)


def print_tradeoff(frame, baseline: str, other: str, same: str) -> None:
    """One line under the table: what `other` changed against `baseline` (engine labels of the summary `frame`)
    in `same` resources."""
    rows = frame[frame["tenant"] == "all"].set_index("engine")
    if baseline not in rows.index or other not in rows.index:
        return
    a, b = rows.loc[baseline], rows.loc[other]
    changes = ", ".join(f"{title} {_fmt(column, a[column])} -> {_fmt(column, b[column])}"
                        for column, title in TRADEOFF_COLUMNS.items())
    _wide().print(f"{escape(other)} against {escape(baseline)} in {same}: {changes}", highlight=False)


TRADEOFF_COLUMNS = {"cache_hit_rate": "cache hit", "prefill_recompute_rate": "prefill recompute",
                    "ttft_p50_ms": "TTFT p50 ms", "ttft_p99_ms": "TTFT p99 ms", "output_tok_s": "out tok/s"}


def results_line(run_dir: Path) -> str:
    from kvbench.measure.run_folder import REQUESTS_JSONL, SUMMARY_CSV, SUMMARY_JSON, SUMMARY_MD

    return f"results: {run_dir}/{SUMMARY_MD}, {SUMMARY_CSV}, {SUMMARY_JSON}, {REQUESTS_JSONL}"


def frame_table(frame, columns: dict[str, str]) -> Table:
    table = Table(show_lines=False)
    for column, title in columns.items():
        table.add_column(title, justify="right" if frame[column].dtype.kind in "fi" else "left")
    for _, row in frame[list(columns)].iterrows():
        table.add_row(*[_fmt(column, row[column]) for column in columns])
    return table


def _fmt(column: str, value) -> str:
    import pandas as pd

    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    if column.endswith("_rate"):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.1f}"
    return escape(str(value))  # engine labels like kvengine[kv_dtype=fp8] are not markup
