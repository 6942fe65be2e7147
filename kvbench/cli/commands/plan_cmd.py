"""`kvbench plan`: the fewest simulated nodes that meet an SLO, per preset and KV dtype."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from kvbench.cli.console_table import Column, print_table
from kvbench.cli.flag_types import at_least
from kvbench.settings import SettingsError

console = Console()


def _slo(text: str):
    from kvbench.sim.plan import parse_slo

    try:
        return parse_slo(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _preset(name: str) -> str:
    from kvbench.sim.presets import PRESETS

    if name not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {name!r}; use one of {', '.join(PRESETS)}")
    return name


def register(commands, formatter) -> None:
    from kvbench.cli.commands.sim_cmd import add_simulated_load_flags
    from kvbench.sim.geometry import known_models
    from kvbench.sim.plan import SLO_EXAMPLE, SLO_METRICS, SLO_STATS
    from kvbench.sim.presets import PRESETS, ROUTES

    plan = commands.add_parser(
        "plan",
        help="fewest nodes that meet an SLO, per preset and KV dtype (simulated)",
        description="For each preset and KV dtype, simulate the workload on 1, 2, 4, ... nodes until every SLO is "
        "met, then bisect to the fewest nodes that meet them (this assumes more nodes never hurt; the count above "
        "the answer is checked and anything non-monotone is reported). Requests are routed across nodes by the "
        "preset's policy (sglang-radix: prefix-aware; lmcache-shared: least-loaded; others: sticky sessions) "
        "unless --route says otherwise. Writes plan.json, plan.md and a plot of each SLO metric against nodes.",
        formatter_class=formatter,
    )
    plan.add_argument("--workload", default="rag-chat", metavar="W|TRACE", help="profile name or trace/param file")
    plan.add_argument(
        "--slo",
        type=_slo,
        required=True,
        help=f"comma-separated METRIC_STAT_ms=LIMIT, e.g. {SLO_EXAMPLE} (metrics: "
        f"{', '.join(SLO_METRICS)}; statistics: {', '.join(SLO_STATS)})",
    )
    plan.add_argument(
        "--model", default="qwen2.5-72b", help=f"shipped model ({', '.join(known_models())}) or config.json"
    )
    plan.add_argument(
        "--hardware", default="8xh200", help="one node's hardware profile: 8xh200, h200, cpu, NxPROFILE, .json"
    )
    plan.add_argument(
        "--preset",
        type=_preset,
        action="append",
        default=[],
        metavar="NAME",
        help=f"policy preset, repeatable ({', '.join(PRESETS)}; default: all)",
    )
    plan.add_argument("--kv-dtype", action="append", default=[], metavar="D", help="KV dtype, repeatable (default fp8)")
    plan.add_argument("--weight-dtype", default=None, help="weight dtype (default: the checkpoint's own)")
    plan.add_argument(
        "--route", choices=ROUTES, help="routing across nodes for every preset (default: each preset's own)"
    )
    plan.add_argument("--max-nodes", type=at_least(1), default=64, help="largest node count to try")
    plan.add_argument("--device-kv-tokens", type=at_least(1), help="override the device KV budget (tokens per node)")
    plan.add_argument("--num-sessions", type=at_least(1), help="sessions to generate (or trace rows to keep)")
    add_simulated_load_flags(plan, "plan")
    plan.set_defaults(handler=handle_plan)


def handle_plan(args: argparse.Namespace) -> int:
    from kvbench.measure.schedule import LoadSpec
    from kvbench.sim.geometry import load_geometry
    from kvbench.sim.hardware import load_hardware
    from kvbench.sim.plan_report import PlanLine, write_plan
    from kvbench.workloads.profiles import load_workload

    started = time.perf_counter()
    try:
        geometry = load_geometry(args.model)
        hardware = load_hardware(args.hardware)
        load = LoadSpec(rate=args.rate, concurrency=args.concurrency, num_requests=args.num_requests)
    except ValueError as error:
        raise SettingsError(str(error)) from None
    configs = _configs(args, geometry, hardware)
    workload = load_workload(
        args.workload,
        seed=args.seed,
        num_sessions=args.num_sessions,
        time_scale=args.time_scale,
        vocab_size=min(geometry.vocab_size, 32000),
    )
    run_dir = args.out or Path("runs") / f"plan-{Path(workload.name).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    settings = {
        "workload": args.workload,
        "model": geometry.name,
        "hardware": hardware.name,
        "devices_per_node": hardware.num_devices,
        "load": load.label,
        "num_sessions": args.num_sessions,
        "seed": args.seed,
        "time_scale": args.time_scale,
        "max_nodes": args.max_nodes,
        "device_kv_tokens": args.device_kv_tokens,
        "assumptions": hardware.assumptions(configs[0].cost.pricing if configs else "roofline"),
        "search": "doubling from 1 node, then bisection; assumes more nodes never hurt (checked at answer+1)",
    }
    console.print(f"[yellow]{settings['assumptions']}[/yellow]")
    targets = args.slo
    lines: list[PlanLine] = []
    for config in configs:
        lines.append(_plan_config(workload, load, config, targets, args))
        write_plan(run_dir, lines, targets, settings, plots=False)  # results as the search goes
    settings["wall_s"] = round(time.perf_counter() - started, 1)
    files = write_plan(run_dir, lines, targets, settings, plots=not args.no_plots)
    _print_plan(lines, args.max_nodes, targets, f"{hardware.name} nodes", f"{workload.name}, {geometry.name}")
    console.print(f"planned in {settings['wall_s']} s; results: {', '.join(str(f) for f in files)}")
    return 0


def _configs(args: argparse.Namespace, geometry, hardware) -> list:
    """One simulator config per preset x KV dtype asked for, each checked to fit before any simulation."""
    from kvbench.sim.engine import SimConfig
    from kvbench.sim.presets import PRESETS

    configs = []
    for name in args.preset or list(PRESETS):
        preset = PRESETS[name] if args.route is None else dataclasses.replace(PRESETS[name], route=args.route)
        for kv_dtype in args.kv_dtype or ["fp8"]:
            config = SimConfig(geometry, hardware, preset, kv_dtype, args.weight_dtype, args.device_kv_tokens)
            try:
                config.device_pages()  # an unknown dtype or weights that do not fit: before any simulation
            except ValueError as error:
                raise SettingsError(f"--kv-dtype {kv_dtype} / --weight-dtype: {error}") from None
            configs.append(config)
    return configs


def _plan_config(workload, load, config, targets, args: argparse.Namespace):
    """The node search of one config: its SLO floors at unbounded nodes first (an SLO below them is refused
    without simulating), then doubling and bisection, each point said as it is simulated."""
    from kvbench.sim.plan import NodeSearch, plan_point, search_nodes
    from kvbench.sim.plan_floor import slo_floors, unreachable
    from kvbench.sim.plan_report import PlanLine

    label = f"{config.preset.name}/{config.kv_dtype}"

    def written(point):
        verdict = "meets" if point.meets else "misses"
        values = ", ".join(f"{k} {'-' if v is None else f'{v:,.0f}'}" for k, v in point.values.items())
        console.print(
            f"{label} on {point.nodes} node(s): {values}: {verdict} "
            f"({point.virtual_s:,.0f} s served, simulated in {point.wall_s:.1f} s)"
        )

    floors = slo_floors(workload, config, targets)  # at unbounded nodes: known before any simulation
    console.print(
        f"{label} floor at unbounded nodes: " + ", ".join(f"{name} {value:,.0f} ms" for name, value in floors.items())
    )
    reason = unreachable(targets, floors)
    if reason is not None:
        console.print(f"{label}: {reason}")
        search = NodeSearch(None, (), (), reason, floors)
        return PlanLine(config.preset.name, config.kv_dtype, config.preset.route, search)
    try:
        search = search_nodes(
            lambda n: plan_point(workload, load, config, n, targets, args.seed),
            args.max_nodes,
            targets,
            on_point=written,
        )
    except ValueError as error:
        raise SettingsError(f"{label}: {error}") from None
    search = dataclasses.replace(search, floors=floors)
    return PlanLine(config.preset.name, config.kv_dtype, config.preset.route, search)


def _print_plan(lines, max_nodes: int, targets, nodes: str, what: str) -> None:
    """The answer of every config (fewest nodes meeting the SLO, what was tried, node-hours), then any
    non-monotone findings."""
    from kvbench.sim.plan_report import answer_text

    columns = [
        Column("preset", False),
        Column("KV", False),
        Column("routing", False),
        Column("nodes needed", True),
        Column("node counts tried", False),
        Column("node-h at answer", True),
        Column("non-monotone", True),
    ]
    rows = []
    for row in lines:
        at = next((p for p in row.search.points if p.nodes == row.search.answer), None)
        rows.append(
            [
                escape(row.preset),
                escape(row.kv_dtype),
                escape(row.route),
                answer_text(row.search, max_nodes),
                ", ".join(str(p.nodes) for p in row.search.points),
                "-" if at is None else f"{at.node_hours:,.2f}",
                str(len(row.search.non_monotone)),
            ]
        )
    print_table(
        console,
        columns,
        rows,
        keys=2,
        title=f"fewest {nodes} for {', '.join(f'{t.name} <= {t.limit_ms:g}' for t in targets)} ({what})",
    )
    for row in lines:
        for finding in row.search.non_monotone:
            console.print(f"[yellow]non-monotone {row.preset}/{row.kv_dtype}: {finding}[/yellow]")
