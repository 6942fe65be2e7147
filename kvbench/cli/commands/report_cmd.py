"""`kvbench report RUN_DIR...`: one table across run folders, and other tools' result files beside them (vLLM
bench, AIPerf, guidellm: measure/foreign_results.py), each row labelled by the tool that measured it.

A folder without summary.json (its run was killed before it wrote one) gets one rebuilt from config.yaml and
requests.jsonl, written into the folder, and said so on stderr. A folder of run folders (a `--find-max` search's
probes/, or any folder holding run folders) stands for them, a row per probe.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape

from kvbench.measure.report import MD_COLUMNS, markdown_table, summary_frame, write_summaries
from kvbench.measure.run_folder import CONFIG_YAML, REQUESTS_JSONL, SUMMARY_JSON, RunEntry, read_entries
from kvbench.settings import SettingsError

error_console = Console(stderr=True, soft_wrap=True)


def register(commands, formatter) -> None:
    parser = commands.add_parser(
        "report",
        help="tables across run folders",
        description=f"Print one table across run folders. A folder whose run was killed before it wrote {SUMMARY_JSON} "
        f"gets one rebuilt from its {CONFIG_YAML} and {REQUESTS_JSONL}.",
        formatter_class=formatter,
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="kvbench run folders, and beside them other tools' result files (table, md, csv): "
        "vllm bench serve --save-result JSON, AIPerf's profile_export_aiperf.json or its artifact "
        "folder, guidellm's benchmarks.json; the tool column says who measured each row",
    )
    parser.add_argument(
        "--format",
        choices=("table", "md", "csv", "html"),
        default="table",
        help="table: kvbench's console table (numbers never cut); md: Markdown; csv; html: one "
        "self-contained file (tables, plots, config, env, flags), see --out",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="--format html: the file to write (default RUN_DIR/report.html for "
        "one folder, ./kvbench-report.html for several)",
    )
    parser.add_argument("--all-tenants", action="store_true", help="include per-tenant rows (default: totals only)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.format == "html":
        return _html(args)
    from kvbench.measure.foreign_results import EXPECTED, is_foreign, read_foreign

    frames = []
    for run_dir in [folder for given in args.run_dirs for folder in _run_folders(given)]:
        if is_foreign(run_dir):  # another tool's result file, beside our run folders
            rows = read_foreign(run_dir)
            frame = pd.DataFrame(rows, columns=[*summary_frame([]).columns, "tool"])
        elif not (run_dir / SUMMARY_JSON).exists() and not (run_dir / REQUESTS_JSONL).exists():
            what = "no such file or folder" if not run_dir.exists() else f"no {SUMMARY_JSON} and no {REQUESTS_JSONL}"
            raise SettingsError(f"{run_dir}: {what}; expected {EXPECTED}")
        else:
            frame = summary_frame(_entries(run_dir))
            frame["tool"] = "kvbench"
        frame.insert(
            0,
            "run_dir",
            run_dir.name if run_dir.parent.name != PROBES else f"{run_dir.parent.parent.name}/{run_dir.name}",
        )
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    if not args.all_tenants:
        table = table[table["tenant"] == "all"]
    if args.format == "csv":
        table.to_csv(sys.stdout, index=False)
    elif args.format == "md":
        print(markdown_table(table, ["run_dir", "engine", "tool", *MD_COLUMNS[1:]]))
    else:
        from kvbench.cli.tables import print_frame, wide_console

        print_frame(wide_console(), table, report_columns(table), keys=2)
    return 0


def report_columns(table: pd.DataFrame) -> dict[str, str]:
    """The console table's columns (column -> title): run folders' and other tools' rows alike, so with the
    latencies and rates every tool reports (TPOT, E2E, req/s; goodput when any row has it)."""
    from kvbench.cli.tables import GOODPUT_TITLES, SUMMARY_COLUMNS

    columns = {"run_dir": "run", "engine": "engine", "tool": "tool"}
    for column, title in SUMMARY_COLUMNS.items():
        columns.setdefault(column, title)
        if column == "itl_p50_ms":
            columns.update({"tpot_p50_ms": "TPOT p50 ms", "e2e_p99_ms": "E2E p99 ms", "req_s": "req/s"})
        if column == "output_tok_s" and table["goodput_req_s"].notna().any():
            columns.update(GOODPUT_TITLES)
    return columns


def _html(args: argparse.Namespace) -> int:
    from kvbench.measure.foreign_results import is_foreign
    from kvbench.measure.html_report import report_html

    run_dirs = [folder for given in args.run_dirs for folder in _run_folders(given)]
    for run_dir in run_dirs:
        if is_foreign(run_dir):
            raise SettingsError(
                f"{run_dir}: --format html reads kvbench run folders only; show other tools' result "
                "files with --format table, md or csv"
            )
    out = args.out or (args.run_dirs[0] / "report.html" if len(args.run_dirs) == 1 else Path("kvbench-report.html"))
    out.write_text(report_html(run_dirs, [_entries(run_dir) for run_dir in run_dirs]))
    print(f"report: {out}")
    return 0


PROBES = "probes"  # harness/find_max.py: one run folder per probe under SEARCH_DIR/probes/


def _run_folders(path: Path) -> list[Path]:
    """The run folders `path` stands for: itself, or for a folder that holds run folders rather than being one
    (a `--find-max` search: its probes/NN-.../; any folder of run folders), those, in name order."""
    if not path.is_dir() or (path / SUMMARY_JSON).exists() or (path / REQUESTS_JSONL).exists():
        return [path]
    inner = sorted(
        child
        for child in (*path.glob("*"), *path.glob(f"{PROBES}/*"))
        if child.is_dir() and ((child / SUMMARY_JSON).exists() or (child / REQUESTS_JSONL).exists())
    )
    return inner or [path]


def _entries(run_dir: Path) -> list[RunEntry]:
    if (run_dir / SUMMARY_JSON).exists():
        return read_entries(run_dir)
    from kvbench.harness.runner import rebuild_entries

    entries = rebuild_entries(run_dir)
    write_summaries(run_dir, entries)
    error_console.print(
        f"{escape(str(run_dir))}: no {SUMMARY_JSON}; rebuilt it from {CONFIG_YAML} and {REQUESTS_JSONL} "
        f"({len(entries)} points, marked interrupted)",
        highlight=False,
    )
    return entries
