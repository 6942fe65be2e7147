"""`kvbench compare BASELINE_DIR NEW_DIR` (the nightly gate) and `kvbench baseline update RUN_DIR --name NAME`.

compare exits 0 (no regression), 1 (a regression; with --strict also a mismatch or an inconclusive metric) or 2
(bad input).
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape

from kvbench.cli.console_table import Column, fits, print_table
from kvbench.cli.flag_types import at_least, number_between
from kvbench.cli.tables import wide_console
from kvbench.measure.run_folder import EVAL_JSON, SUMMARY_JSON, RunFolder, RunFolderError, read_run_folder
from kvbench.settings import SettingsError
from kvbench.verdicts.baseline import BASELINE_FILES, DEFAULT_ROOT, PROVENANCE_JSON, BaselineError, promote
from kvbench.verdicts.compare import CompareOptions, Comparison, MetricComparison, compare
from kvbench.verdicts.gate_metrics import DEFAULT_METRICS, PERF_METRICS

EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT = 0, 1, 2
CSV_COLUMNS = [
    "kind",
    "setting",
    "kv_dtype",
    "metric",
    "better",
    "scale",
    "baseline",
    "new",
    "delta",
    "ci_low",
    "ci_high",
    "tolerance",
    "mde",
    "verdict",
    "note",
]

errors = Console(stderr=True, soft_wrap=True)


def register(commands, formatter) -> None:
    parser = commands.add_parser(
        "compare",
        help="compare a run folder with a baseline; exit 1 on a regression",
        description="Per engine setting and metric: baseline, new value, delta, a bootstrap confidence interval "
        "of the delta (requests resampled, repetitions too), and a verdict. A regression needs both: the CI lies "
        "wholly on the bad side of 0 AND the delta exceeds the metric's tolerance; no change needs the CI wholly within "
        "the tolerance; anything else is inconclusive (too few requests for that tolerance). Rates are compared in "
        f"percentage points. Quality metrics of {EVAL_JSON} (when both folders have one) are compared by tolerance. "
        "Exit 0: no regression; 1: a regression (or, with --strict, a mismatch or an inconclusive metric); 2: bad input.",
        formatter_class=formatter,
    )
    parser.add_argument(
        "baseline_dir", type=Path, metavar="BASELINE_DIR", help="baseline (results/baselines/NAME or a run folder)"
    )
    parser.add_argument("new_dir", type=Path, metavar="NEW_DIR", help="the run folder to judge")
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        metavar="METRIC",
        help=f"metrics to compare (default {' '.join(DEFAULT_METRICS)}; valid: {', '.join(PERF_METRICS)})",
    )
    parser.add_argument(
        "--max-regression",
        action="append",
        default=[],
        metavar="METRIC=PCT",
        help="tolerance of a metric in percent (rates: percentage points), e.g. ttft_p99=15; repeatable",
    )
    parser.add_argument(
        "--confidence", type=number_between(0, 1), default=0.99, help="confidence level of the intervals (default 0.99)"
    )
    parser.add_argument("--resamples", type=at_least(1), default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--seed", type=at_least(0), default=0, help="bootstrap seed (default 0)")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="also exit 1 when the folders do not measure the same thing, or a metric is inconclusive",
    )
    parser.add_argument(
        "--allow-inconclusive",
        action="store_true",
        help="with --strict: an inconclusive metric is reported (headline, table) but does not fail; "
        "mismatches and regressions still do (for a gate whose runs cannot resolve every metric)",
    )
    parser.add_argument(
        "--format",
        choices=("table", "md", "csv"),
        default="table",
        help="table: kvbench's console tables (numbers never cut); md: Markdown; csv",
    )
    parser.add_argument(
        "--out", type=Path, help="also write the comparison to this file (Markdown, or CSV with --format csv)"
    )
    parser.set_defaults(handler=handle_compare)

    baseline = commands.add_parser("baseline", help="manage stored baselines", formatter_class=formatter)
    actions = baseline.add_subparsers(title="actions", metavar="ACTION")
    update = actions.add_parser(
        "update",
        help="promote a run folder to results/baselines/NAME",
        description=f"Copy a run folder's {', '.join(BASELINE_FILES)} (those it has; {SUMMARY_JSON} is required) to "
        f"ROOT/NAME, replacing what was there, and write {PROVENANCE_JSON} (commit, machine, dates, command).",
        formatter_class=formatter,
    )
    update.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    update.add_argument("--name", required=True, help="baseline name, e.g. nightly-cpu (the ci/NAME.yaml config)")
    update.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"baselines folder (default {DEFAULT_ROOT})")
    update.set_defaults(handler=handle_baseline_update)


def handle_compare(args: argparse.Namespace) -> int:
    try:
        baseline, new = read_run_folder(args.baseline_dir), read_run_folder(args.new_dir)
        options = CompareOptions(
            metrics=tuple(_metric_names(args.metrics)) if args.metrics else CompareOptions().metrics,
            tolerances=_tolerances(args.max_regression, baseline, new),
            confidence=args.confidence,
            resamples=args.resamples,
            seed=args.seed,
        )
    except (RunFolderError, SettingsError, ValueError) as exc:
        errors.print(f"[bold red]error:[/bold red] {exc}", highlight=False)
        return EXIT_BAD_INPUT
    comparison = compare(baseline, new, options)
    text = comparison_csv(comparison) if args.format == "csv" else comparison_markdown(comparison)
    if args.format == "table":
        print_comparison(wide_console(), comparison)
    else:
        sys.stdout.write(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return comparison.exit_code(strict=args.strict, allow_inconclusive=args.allow_inconclusive)


def handle_baseline_update(args: argparse.Namespace) -> int:
    try:
        provenance = promote(args.run_dir, args.name, args.root)
    except BaselineError as exc:
        errors.print(f"[bold red]error:[/bold red] {exc}", highlight=False)
        return EXIT_BAD_INPUT
    print(f"baseline {args.root / args.name} <- {args.run_dir} (commit {provenance.git_commit or 'unknown'})")
    if provenance.missing_files:
        print(f"not in the run folder: {', '.join(provenance.missing_files)}")
    return EXIT_OK


def _metric_names(values: list[str]) -> list[str]:
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _tolerances(items: list[str], baseline: RunFolder, new: RunFolder) -> dict[str, float]:
    known = set(PERF_METRICS)
    for data in (baseline, new):
        for metrics in (data.evals or {}).values():
            known.update(metrics)
    tolerances = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            percent = float(value)
        except ValueError:
            percent = math.nan
        if not sep or math.isnan(percent) or percent < 0:
            raise SettingsError(f"--max-regression {item!r}: expected METRIC=PERCENT, e.g. ttft_p99=15")
        if name not in known:
            raise SettingsError(
                f"--max-regression {item!r}: unknown metric {name!r}; valid: {', '.join(sorted(known))}"
            )
        tolerances[name] = percent / 100.0
    return tolerances


# --- formatting (no computation beyond rounding) -----------------------------------------------------------


def _value(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"


def _delta(row: MetricComparison, value: float | None) -> str:
    if value is None or row.spec is None:
        return "n/a"
    if row.spec.scale == "points":
        return f"{100 * value:+.2f} pp"
    return f"{100 * value:+.1f}%"


def _row_cells(row: MetricComparison) -> dict:
    spec = row.spec
    ci = f"[{_delta(row, row.ci_low)}, {_delta(row, row.ci_high)}]" if row.ci_low is not None else "n/a"
    tolerance = (
        ""
        if spec is None
        else (f"{100 * spec.tolerance:.2f} pp" if spec.scale == "points" else f"{100 * spec.tolerance:.1f}%")
    )
    verdict = row.verdict.value.upper() if row.verdict.value == "regression" else row.verdict.value
    return {
        "setting": row.setting,
        "kv_dtype": row.kv_dtype,
        "metric": row.metric,
        "better": "" if spec is None else spec.better,
        "baseline": _value(row.baseline),
        "new": _value(row.new),
        "delta": _delta(row, row.delta),
        "CI": ci,
        "tolerance": tolerance,
        "MDE": "n/a" if row.mde is None else _delta(row, row.mde).lstrip("+"),
        "verdict": verdict,
        "note": row.note,
    }


def _headline(comparison: Comparison, strong) -> str:
    """The result in one sentence; `strong` marks its alarming parts (Markdown bold, console colour)."""
    regressions, improvements, unresolved = comparison.regressions, comparison.improvements, comparison.inconclusive
    headline = (
        strong(f"{len(regressions)} regression{'s' if len(regressions) != 1 else ''}")
        if regressions
        else "no regression"
    )
    return (
        f"Result: {headline}, {len(improvements)} improvement{'s' if len(improvements) != 1 else ''}"
        + (
            f", {strong(f'{len(unresolved)} inconclusive')} (the interval reaches past the tolerance: more "
            "requests or repetitions, or a wider --max-regression)"
            if unresolved
            else ""
        )
        + (f", {strong('the folders do not measure the same thing')} (see Mismatches)" if comparison.mismatched else "")
        + "."
    )


def _method(comparison: Comparison) -> str:
    options = comparison.options
    return (
        f"A regression needs both: the {100 * options.confidence:g}% bootstrap CI of the delta lies wholly on the "
        f"bad side of 0 ({options.resamples} resamples of requests, repetitions resampled too, seed "
        f"{options.seed}) AND the delta exceeds the tolerance; no change needs the whole CI within the tolerance, "
        "else the metric is inconclusive. Deltas are relative (%) or, for rates, in percentage points (pp). "
        "Values are the mean over repetitions; percentiles use linear interpolation. Throughputs are judged from "
        "the repetitions' own rates (Student's t, from 3 repetitions a side; with fewer, from the requests by Little's law); "
        "a per-request metric's interval is widened to its repetitions' spread where that is wider. "
        "MDE: the smallest "
        "change this run size calls a regression 4 times in 5."
    )


def _sections(comparison: Comparison) -> list[tuple[str, list[MetricComparison], bool]]:
    """(title, rows, with the CI) of each table, in order."""
    perf = [row for row in comparison.rows if row.kind == "perf"]
    quality = [row for row in comparison.rows if row.kind == "quality"]
    sections = [
        ("Regressions", list(comparison.regressions), True),
        ("Serving metrics", perf, True),
        (f"Quality ({EVAL_JSON})", quality, False),
    ]
    return [section for section in sections if section[1]]


def print_comparison(console: Console, comparison: Comparison) -> None:
    """The comparison in kvbench's console style: the result, then each section as a table whose numbers are
    never cut (cli/console_table.py)."""
    console.print(
        f"[bold]kvbench compare[/bold]: {escape(str(comparison.baseline_dir))} -> {escape(str(comparison.new_dir))}",
        highlight=False,
    )
    console.print(_headline(comparison, lambda text: f"[bold red]{escape(text)}[/bold red]"), highlight=False)
    console.print(_method(comparison), style="dim", highlight=False)
    for title, rows, with_ci in _sections(comparison):
        cells = [_row_cells(row) for row in rows]
        names = [name for name in cells[0] if with_ci or name not in ("CI", "MDE", "kv_dtype")]
        columns = [Column({"kv_dtype": "kv"}.get(name, name), name in _NUMERIC) for name in names]
        table = [[escape(str(cell[name])) for name in names] for cell in cells]
        keys = 3 if with_ci else 2
        if not fits(console, columns, table, keys):  # narrow: stack the columns, so each verdict keeps its row
            columns, table, keys = _stacked(cells, with_ci)
        print_table(console, columns, table, keys=keys, title=title)
    for title, lines in (("Mismatches", comparison.mismatches), ("Notes", comparison.notes)):
        if lines:
            console.print(f"[bold]{title}[/bold]")
            for text in lines:
                console.print(f"- {escape(text)}", highlight=False)


_NUMERIC = {"baseline", "new", "delta", "CI", "tolerance", "MDE"}
# A narrow console's layout: each column two values stacked, the verdict in the metric's own cell (the key column
# every part of a split table repeats), so no verdict is ever printed away from its metric.
_STACKED = (
    ("metric: verdict\nsetting kv", False),
    ("baseline\nnew", True),
    ("delta\nCI", True),
    ("tolerance\nbetter", True),
)


def _stacked(cells: list[dict], with_ci: bool) -> tuple[list[Column], list[list[str]], int]:
    """(columns, rows, key columns) of the stacked layout; a note, when any row has one, in a last column."""
    rows = []
    for cell in cells:
        key = f"{cell['metric']}: {cell['verdict']}\n{cell['setting']}" + (f" {cell['kv_dtype']}" if with_ci else "")
        rows.append(
            [
                key,
                f"{cell['baseline']}\n{cell['new']}",
                f"{cell['delta']}\n{cell['CI'] if with_ci else ''}",
                f"{cell['tolerance']}\n{cell['better']}",
            ]
        )
    columns = [Column(title, numeric) for title, numeric in _STACKED]
    if not with_ci:
        rows = [row[:2] + [row[2].rstrip()] + row[3:] for row in rows]
        columns[2] = Column("delta", True)
    if any(cell["note"] for cell in cells):
        columns.append(Column("note", False))
        rows = [row + [cell["note"]] for row, cell in zip(rows, cells)]
    return columns, [[escape(text) for text in row] for row in rows], 1


def comparison_markdown(comparison: Comparison) -> str:
    lines = [
        f"# kvbench compare: `{comparison.baseline_dir}` -> `{comparison.new_dir}`",
        "",
        _headline(comparison, lambda text: f"**{text}**"),
        "",
        _method(comparison),
        "",
    ]
    for title, rows, with_ci in _sections(comparison):
        lines += [f"## {title}", "", _table(rows, with_ci), ""]
    if comparison.mismatches:
        lines += ["## Mismatches", "", *[f"- {text}" for text in comparison.mismatches], ""]
    if comparison.notes:
        lines += ["## Notes", "", *[f"- {text}" for text in comparison.notes], ""]
    return "\n".join(lines)


def _table(rows: list[MetricComparison] | tuple[MetricComparison, ...], with_ci: bool = True) -> str:
    frame = pd.DataFrame([_row_cells(row) for row in rows])
    if not with_ci:
        frame = frame.drop(columns=["CI", "MDE", "kv_dtype"])
    return frame.to_markdown(index=False)


def comparison_csv(comparison: Comparison) -> str:
    records = []
    for row in comparison.rows:
        spec = row.spec
        records.append(
            {
                "kind": row.kind,
                "setting": row.setting,
                "kv_dtype": row.kv_dtype,
                "metric": row.metric,
                "better": spec.better if spec else None,
                "scale": spec.scale if spec else None,
                "baseline": row.baseline,
                "new": row.new,
                "delta": row.delta,
                "ci_low": row.ci_low,
                "ci_high": row.ci_high,
                "tolerance": spec.tolerance if spec else None,
                "mde": row.mde,
                "verdict": row.verdict.value,
                "note": row.note,
            }
        )
    records += [{"kind": "mismatch", "note": text} for text in comparison.mismatches]
    records += [{"kind": "note", "note": text} for text in comparison.notes]
    buffer = io.StringIO()
    pd.DataFrame(records, columns=CSV_COLUMNS).to_csv(buffer, index=False)
    return buffer.getvalue()
