"""`kvbench validate-published CASE.yaml`: a published GPU experiment replayed on the simulator, side by side."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvbench.settings import SettingsError

console = Console()


def register(commands, formatter) -> None:
    from kvbench.sim.presets import ROUTES

    cmd = commands.add_parser(
        "validate-published", help="replay a published GPU experiment (case file) and compare it per stage",
        description="Simulate every router of a published case (results/sim/published/*.yaml) over its load "
        "stages and print published vs simulated per stage with ratios (simulated / published), then the accuracy "
        "targets. Writes comparison.md and comparison.json.", formatter_class=formatter)
    cmd.add_argument("case", type=Path, help="case file, e.g. results/sim/published/llm-d-precise-prefix.yaml")
    cmd.add_argument("--fit", type=Path, help="fitted efficiencies (kvbench calibrate --published writes one)")
    cmd.add_argument("--router", action="append", default=[], choices=ROUTES, help="only these routers (repeatable)")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--replicas", type=int, help="simulate only this many replicas at that share of every rate "
                     "(throughput scaled back; for round-robin-like routers): a cheaper check, said in the output")
    cmd.add_argument("--out", type=Path, help="folder for comparison.md/json (default runs/published-<case>-<time>)")
    cmd.set_defaults(handler=handle_validate)


def print_rows(rows, route: str) -> None:
    from kvbench.sim.published import STAGE_METRICS
    from kvbench.sim.published_report import fmt_value, fmt_ratio

    table = Table(title=f"{route}: published | simulated | ratio")
    table.add_column("rate", justify="right")
    for metric in STAGE_METRICS:
        for part in ("pub", "sim", "x"):
            table.add_column(f"{metric} {part}" if part == "pub" else part, justify="right")
    by = {(r.stage, r.metric): r for r in rows if r.route == route}
    for stage in dict.fromkeys(r.stage for r in rows if r.route == route and r.stage != "whole"):
        cells = [stage]
        for metric in STAGE_METRICS:
            row = by.get((stage, metric))
            cells += [fmt_value(row and row.published, metric), fmt_value(row and row.simulated, metric), fmt_ratio(row)]
        table.add_row(*cells)
    console.print(table)
    for row in (r for r in rows if r.route == route and r.stage == "whole"):
        console.print(f"  whole ladder {row.metric}: {fmt_value(row.published, row.metric)} published, "
                      f"{fmt_value(row.simulated, row.metric)} simulated ({fmt_ratio(row)})")


def handle_validate(args: argparse.Namespace) -> int:
    from kvbench.sim.published import CaseError, compare_route, load_fit, parse_case, subsample
    from kvbench.sim.published_report import check_targets, write_comparison

    try:
        case = parse_case(args.case)
        fit = load_fit(args.fit) if args.fit else None
        full = case
        if args.replicas is not None:
            case = subsample(case, args.replicas)
    except CaseError as error:
        raise SettingsError(str(error)) from None
    routes = args.router or list(case.routers)
    out = args.out or Path("runs") / f"published-{case.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    rows, header = [], [f"case: {args.case}", f"fit: {args.fit or 'none (the profile assumed values)'}"]
    if args.replicas is not None:
        header.append(f"subsampled: {args.replicas} of {full.replicas} replicas at {args.replicas}/{full.replicas} "
                      f"of every rate, throughput x {case.fleet_scale:g}")
        console.print(header[-1])
    for route in routes:
        try:
            run = compare_route(case, route, fit, seed=args.seed)
        except ValueError as error:
            raise SettingsError(f"{args.case} ({route}): {error}") from None
        config_line = (f"{route}: {len(run.staged.result.records):,} requests, {run.staged.result.virtual_s:,.0f} s "
                       f"virtual, simulated in {run.staged.result.wall_s:.0f} s")
        console.print(config_line)
        header.append(config_line)
        rows += run.rows
        print_rows(run.rows, route)
    fitted = fit.fitted_rows if fit is not None else ()
    targets = check_targets(rows, [f"{s.rate:g}" for s in full.plan.stages], fitted)
    for t in targets:
        verdict = "[green]met[/green]" if t.met else "[red]not met[/red]" if t.met is False else "n/a"
        console.print(f"{verdict}: {t.name} ({t.detail})")
    files = write_comparison(out, case.name, rows, targets, header, fitted)
    console.print(f"results: {', '.join(str(f) for f in files)}")
    return 0
