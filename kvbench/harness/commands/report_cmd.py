"""`kvbench report RUN_DIR...`: one table across run folders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from kvbench.harness.report import markdown_table, read_entries, summary_frame


def register(commands, formatter) -> None:
    parser = commands.add_parser(
        "report", help="tables across run folders", description="Print one table across run folders.",
        formatter_class=formatter,
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--format", choices=("md", "csv"), default="md")
    parser.add_argument("--all-tenants", action="store_true", help="include per-tenant rows (default: totals only)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    frames = []
    for run_dir in args.run_dirs:
        frame = summary_frame(read_entries(run_dir))
        frame.insert(0, "run_dir", run_dir.name)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    if not args.all_tenants:
        table = table[table["tenant"] == "all"]
    if args.format == "csv":
        table.to_csv(sys.stdout, index=False)
    else:
        from kvbench.harness.report import MD_COLUMNS

        print(markdown_table(table, ["run_dir", *MD_COLUMNS]))
    return 0
