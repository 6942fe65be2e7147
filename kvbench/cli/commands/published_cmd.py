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
    cmd = commands.add_parser(
        "validate-published",
        help="replay a published GPU experiment (case file) and compare it arm by arm",
        description="Simulate every arm of a published case (results/sim/published/*.yaml) over its load (stages "
        "or a closed loop) and print published vs simulated per stage and for the whole run with ratios "
        "(simulated / published), the published effects beside the simulated ones, then the accuracy targets. "
        "Writes comparison.md and comparison.json (arms, stages, effects, rows); with --seeds, each seed's under seed-N/ as it finishes "
        "and, at the top, the median across seeds with their range, on which the targets are judged.",
        formatter_class=formatter,
    )
    cmd.add_argument("case", type=Path, help="case file, e.g. results/sim/published/llm-d-precise-prefix.yaml")
    cmd.add_argument("--fit", type=Path, help="fitted efficiencies (kvbench calibrate --published writes one)")
    cmd.add_argument(
        "--arm",
        "--router",
        dest="arm",
        action="append",
        default=[],
        help="only these arms (repeatable; a version-1 case's arms are its routers)",
    )
    seeds = cmd.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0)
    seeds.add_argument(
        "--seeds",
        help="comma-separated seeds, e.g. 0,1,2: simulate each router once per seed and "
        "compare the median across seeds per stage (the seeds' min-max range beside it)",
    )
    cmd.add_argument(
        "--replicas",
        type=int,
        help="simulate only this many replicas at that share of every rate "
        "(throughput scaled back; for round-robin-like routers): a cheaper check, said in the output",
    )
    cmd.add_argument("--out", type=Path, help="folder for comparison.md/json (default runs/published-<case>-<time>)")
    cmd.set_defaults(handler=handle_validate)


def parse_seeds(text: str) -> tuple[int, ...]:
    """`--seeds 0,1,2` as distinct seeds >= 0, in the order given (SettingsError naming the flag otherwise)."""
    try:
        seeds = tuple(int(part) for part in text.split(","))
    except ValueError:
        seeds = ()
    if not seeds or any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
        raise SettingsError(f"--seeds {text!r}: give distinct comma-separated integers >= 0, e.g. --seeds 0,1,2")
    return seeds


def print_rows(rows, route: str, spreads=None) -> None:
    from kvbench.sim.published import STAGE_METRICS, WHOLE
    from kvbench.sim.published_report import fmt_ratio, fmt_simulated, fmt_value

    table = Table(title=f"{route}: published | simulated{' median (min-max)' if spreads else ''} | ratio")
    table.add_column("rate", justify="right")
    for metric in STAGE_METRICS:
        for part in ("pub", "sim", "x"):
            table.add_column(f"{metric} {part}" if part == "pub" else part, justify="right")
    by = {(r.stage, r.metric): r for r in rows if r.arm == route}
    stages = list(dict.fromkeys(r.stage for r in rows if r.arm == route and r.stage != WHOLE))
    for stage in stages:
        cells = [stage]
        for metric in STAGE_METRICS:
            row = by.get((stage, metric))
            cells += [fmt_value(row and row.published, metric), fmt_simulated(row, spreads), fmt_ratio(row)]
        table.add_row(*cells)
    if stages:
        console.print(table)
    for row in (r for r in rows if r.arm == route and r.stage == WHOLE):
        console.print(
            f"  {route} whole run {row.metric}: {fmt_value(row.published, row.metric)} published, "
            f"{fmt_simulated(row, spreads)} simulated ({fmt_ratio(row)})"
        )


def handle_validate(args: argparse.Namespace) -> int:
    from kvbench.sim.published import (
        CaseError,
        across_seeds,
        load_fit,
        parse_case,
        subsample,
    )
    from kvbench.sim.published_report import check_targets

    seeds = parse_seeds(args.seeds) if args.seeds is not None else (args.seed,)
    try:
        case = parse_case(args.case)
        fit = load_fit(args.fit) if args.fit else None
        full = case
        if args.replicas is not None:
            case = subsample(case, args.replicas)
    except CaseError as error:
        raise SettingsError(str(error)) from None
    routes = args.arm or list(case.arm_names)
    unknown = [a for a in routes if a not in case.arm_names]
    if unknown:
        raise SettingsError(f"--arm {unknown[0]}: the case's arms are {', '.join(case.arm_names)}")
    out = args.out or Path("runs") / f"published-{case.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    header = [f"case: {args.case}", f"fit: {args.fit or 'none (the profile assumed values)'}"]
    if args.replicas is not None:
        header.append(
            f"subsampled: {args.replicas} of {full.replicas} replicas at {args.replicas}/{full.replicas} "
            f"of every rate, throughput x {case.fleet_scale:g}"
        )
        console.print(header[-1])
    fitted = fit.rows_of(case.name) if fit is not None else ()
    stages = list(full.stage_labels)
    if len(seeds) == 1:
        rows, lines = simulate_seed(case, routes, fit, seeds[0], args.case, show=True)
        return report(out, case, rows, check_targets(rows, stages, fitted), header + lines, fitted)
    seeds_line = (
        f"seeds: {len(seeds)} ({', '.join(map(str, seeds))}); simulated = the median across seeds, their "
        "min-max range beside it; ratios and targets on the medians; each seed's own under seed-N/"
    )
    console.print(seeds_line)
    per_seed, seed_lines = [], []
    for seed in seeds:
        rows, lines = simulate_seed(case, routes, fit, seed, args.case, show=False)
        per_seed.append(rows)
        seed_lines += lines
        # Written as each seed finishes: an interrupted sweep keeps the seeds it measured.
        report(
            out / f"seed-{seed}",
            case,
            rows,
            check_targets(rows, stages, fitted),
            header + [f"seed: {seed} (of --seeds {args.seeds})"] + lines,
            fitted,
            prefix=f"seed {seed} ",
        )
    header += [seeds_line, *seed_lines]
    spreads = across_seeds(per_seed)
    rows = [s.row for s in spreads]
    by_key = {s.row.key: s for s in spreads}
    for route in routes:
        print_rows(rows, route, by_key)
    return report(out, case, rows, check_targets(rows, stages, fitted), header, fitted, spreads, seeds)


def simulate_seed(case, routes, fit, seed: int, case_path: Path, show: bool) -> tuple[list, list[str]]:
    """Every arm of `case` at `seed`: its rows and one line per arm (requests, virtual and wall time)."""
    from kvbench.sim.published import compare_arm

    rows, lines = [], []
    for route in routes:
        try:
            run = compare_arm(case, route, fit, seed=seed)
        except ValueError as error:
            raise SettingsError(f"{case_path} ({route}): {error}") from None
        lines.append(
            f"{route}{'' if show else f' seed {seed}'}: {len(run.result.records):,} requests, "
            f"{run.result.virtual_s:,.0f} s virtual, simulated in {run.result.wall_s:.0f} s"
        )
        console.print(lines[-1])
        rows += run.rows
        if show:
            print_rows(run.rows, route)
    return rows, lines


def report(out: Path, case, rows, targets, header, fitted, spreads=(), seeds=(), prefix: str = "") -> int:
    """Print the effects and the targets, write comparison.md/json under `out` and say where."""
    from kvbench.sim.published import effect_rows
    from kvbench.sim.published_report import effect_lines, write_comparison

    effects = effect_rows(case, rows)
    for line in effect_lines(effects):
        console.print(f"{prefix}{line}", markup=False)
    for t in targets:
        verdict = "[green]met[/green]" if t.met else "[red]not met[/red]" if t.met is False else "n/a"
        console.print(f"{prefix}{verdict}: {t.name} ({t.detail})")
    files = write_comparison(out, case.name, rows, targets, header, fitted, spreads, seeds, effects)
    console.print(f"{prefix}results: {', '.join(str(f) for f in files)}")
    return 0
