"""`kvbench capacity` (KV sizes, sessions per tier, restore times) and `kvbench simulate` (the DES)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvbench.cli.flag_types import at_least, number_above
from kvbench.settings import SettingsError

console = Console()
GIB, TIB = 2**30, 2**40


def register(commands, formatter) -> None:
    from kvbench.sim.geometry import known_models
    from kvbench.sim.presets import PRESETS

    cap = commands.add_parser(
        "capacity",
        help="KV bytes per token/session, sessions that fit per tier, restore times",
        description="Capacity plan for a model's KV cache on a hardware profile: bytes per token and session, "
        "device KV budget after weights, sessions that fit in device/host/disk, and the time to restore one "
        "session's KV from each tier.",
        formatter_class=formatter,
    )
    cap.add_argument("--model", required=True, help=f"shipped model ({', '.join(known_models())}) or config.json")
    cap.add_argument("--kv-dtype", default="fp16", help="fp16, bf16, fp8, fp8_e4m3, fp8_e5m2")
    cap.add_argument("--weight-dtype", default=None, help="weight dtype (default: the checkpoint's own)")
    cap.add_argument("--context", type=at_least(1), required=True, help="tokens per session, e.g. 131072")
    cap.add_argument("--sessions", type=at_least(1), required=True, help="concurrent sessions")
    cap.add_argument("--gpus", type=at_least(1), default=None, help="devices (default: the hardware profile's)")
    cap.add_argument("--hardware", default="8xh200", help="hardware profile: 8xh200, h200, cpu, NxPROFILE, or .json")
    cap.add_argument("--json", action="store_true", help="print one JSON object")
    cap.set_defaults(handler=handle_capacity)

    sim = commands.add_parser(
        "simulate",
        help="simulate a workload on modeled hardware (virtual time, same records and tables)",
        description="Replay a workload through the KV core on a virtual clock with a roofline cost model. Writes "
        "the same run folder as `kvbench run` (requests.jsonl with virtual-time ns, summary.{md,csv,json}).",
        formatter_class=formatter,
    )
    sim.add_argument(
        "--model", default="qwen2.5-72b", help=f"shipped model ({', '.join(known_models())}) or config.json"
    )
    sim.add_argument("--hardware", default="8xh200", help="hardware profile")
    sim.add_argument("--workload", default="rag-chat", help="profile name or trace/param file")
    sim.add_argument("--num-sessions", type=at_least(1), help="sessions to generate (or trace rows to keep)")
    sim.add_argument(
        "--preset",
        action="append",
        default=[],
        metavar="NAME",
        help=f"policy preset, repeatable ({', '.join(PRESETS)}; default: all)",
    )
    sim.add_argument("--kv-dtype", action="append", default=[], metavar="D", help="KV dtype, repeatable (default fp8)")
    sim.add_argument("--weight-dtype", default=None, help="weight dtype (default: the checkpoint's own)")
    sim.add_argument("--device-kv-tokens", type=at_least(1), help="override the device KV budget (tokens per node)")
    sim.add_argument("--tenants-file", help="tenant quotas and reservations (the format `kvbench serve` reads)")
    add_fleet_flags(sim)
    add_simulated_load_flags(sim, "sim")
    sim.add_argument(
        "--stages",
        type=_stages,
        metavar="R:S,...",
        help="Poisson load stages RATE:SECONDS, run one after the other, each drained before the next "
        "(e.g. 3:20,10:20); results per stage",
    )
    sim.add_argument("--warmup-stage", type=_stage, metavar="R:S", help="a stage before --stages, left out of results")
    sim.add_argument(
        "--max-concurrency",
        type=at_least(1),
        metavar="C",
        help="the client's cap on requests in flight, with --rate or --stages (as `kvbench run`'s and "
        "vLLM's): requests past it wait in the client, and TTFT counts from the send",
    )
    sim.set_defaults(handler=handle_simulate)


def _stages(text: str):
    from kvbench.measure.stages import parse_stages

    try:
        return parse_stages(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _stage(text: str):
    from kvbench.measure.stages import parse_stage

    try:
        return parse_stage(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_fleet_flags(parser: argparse.ArgumentParser) -> None:
    """What a fleet needs beside the preset: node count, routing, the engine's limits, devices and memory."""
    from kvbench.sim.config import MEMORY_MODELS
    from kvbench.sim.presets import ROUTES

    parser.add_argument("--nodes", type=at_least(1), help="replicas in the fleet (default: the preset's)")
    parser.add_argument("--route", choices=ROUTES, help="routing over the nodes (default: the preset's)")
    parser.add_argument("--page-size", type=at_least(1), help="KV page (block) size in tokens, vLLM's --block-size")
    parser.add_argument("--max-num-seqs", type=at_least(1), help="sequences per step at most (vLLM's flag)")
    parser.add_argument("--max-num-batched-tokens", type=at_least(1), help="tokens per step at most (vLLM's flag)")
    parser.add_argument(
        "--tp",
        "--devices-per-node",
        dest="tp",
        type=at_least(1),
        help="devices per node, one tensor-parallel replica (default: the hardware profile's)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=number_above(0),
        help="share of device memory the engine takes (vLLM's flag; default the profile's 0.9)",
    )
    parser.add_argument(
        "--memory-model",
        choices=MEMORY_MODELS,
        default="reserve",
        help="device KV budget: reserve (memory share less a fixed activation reserve) or vllm "
        "(vLLM's profiled arithmetic at the batch limits)",
    )
    parser.add_argument("--router-latency-ms", type=number_above(-1e-9), help="time in the router per request")


def fleet_preset(preset, args: argparse.Namespace):
    """`preset` with the fleet flags given on the command line."""
    import dataclasses

    flag = _fleet_flags(args)
    changes = {
        "num_nodes": flag["nodes"],
        "route": flag["route"],
        "page_size": flag["page_size"],
        "max_num_seqs": flag["max_num_seqs"],
        "max_step_tokens": flag["max_num_batched_tokens"],
        "router_latency_s": None if flag["router_latency_ms"] is None else flag["router_latency_ms"] / 1e3,
    }
    return dataclasses.replace(preset, **{k: v for k, v in changes.items() if v is not None})


def fleet_hardware(hardware, args: argparse.Namespace):
    import dataclasses

    flag = _fleet_flags(args)
    if flag["tp"] is not None:
        hardware = hardware.with_devices(flag["tp"])
    utilization = flag["gpu_memory_utilization"]
    if utilization is not None:
        if utilization > 1:
            raise SettingsError(f"--gpu-memory-utilization {utilization}: give a fraction in (0, 1]")
        hardware = dataclasses.replace(hardware, memory_fraction=utilization)
    return hardware


_FLEET_FLAGS = (
    "nodes",
    "route",
    "page_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tp",
    "gpu_memory_utilization",
    "router_latency_ms",
    "stages",
    "warmup_stage",
    "max_concurrency",
)


def _fleet_flags(args: argparse.Namespace) -> dict:
    """The fleet, stage and client cap flags of `args`, None where not given (`kvbench run --engine sim` has
    none)."""
    return {name: getattr(args, name, None) for name in _FLEET_FLAGS}


def add_simulated_load_flags(parser: argparse.ArgumentParser, out_prefix: str) -> None:
    """The load, stop, seed and output flags of a simulated run (`simulate`, and each point `plan` tries)."""
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=number_above(0), help="open loop: new sessions per second")
    load.add_argument("--concurrency", type=at_least(1), help="closed loop: requests in flight")
    parser.add_argument("--time-scale", type=number_above(0), default=1.0, help="multiply arrival gaps and think times")
    parser.add_argument("--num-requests", type=at_least(1), help="stop after this many requests")
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--out", type=Path, help=f"results folder (default runs/{out_prefix}-<workload>-<time>)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def handle_capacity(args: argparse.Namespace) -> int:
    from kvbench.sim.capacity import capacity_report
    from kvbench.sim.geometry import load_geometry
    from kvbench.sim.hardware import load_hardware

    try:
        geometry = load_geometry(args.model)
        hardware = load_hardware(args.hardware)
        if args.gpus is not None:
            hardware = hardware.with_devices(args.gpus)
        report = capacity_report(geometry, hardware, args.kv_dtype, args.context, args.sessions, args.weight_dtype)
    except ValueError as error:
        raise SettingsError(str(error)) from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        return 0
    table = Table(
        title=f"KV capacity: {report.model}, {report.kv_dtype} KV, {report.weight_dtype} weights, "
        f"{report.devices} x {hardware.device.name}",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("KV bytes per token", f"{report.kv_bytes_per_token:,.0f} B ({report.kv_bytes_per_token / 1024:.1f} KiB)"),
        ("KV per session", f"{report.kv_bytes_per_session / GIB:,.2f} GiB ({report.context_tokens:,} tokens)"),
        ("KV for all sessions", f"{report.kv_bytes_total / TIB:,.2f} TiB ({report.sessions:,} sessions)"),
        ("weights", f"{report.weight_bytes / GIB:,.1f} GiB"),
        ("devices for all on device", f"{report.devices_needed}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    tiers = Table(title="per tier")
    for column in ("tier", "KV capacity", "sessions that fit", "restore one session"):
        tiers.add_column(column, justify="right")
    for tier in report.tiers:
        size = "unbounded" if tier.bytes == float("inf") else f"{tier.bytes / TIB:,.2f} TiB"
        restore = "-" if tier.restore_s is None else f"{tier.restore_s * 1e3:,.0f} ms"
        fits = f"{tier.sessions:,}" + (" (all)" if tier.tier == "remote" else "")
        tiers.add_row(tier.tier, size, fits, restore)
    console.print(tiers)
    for line in report.fp8_break_even:
        console.print(f"{line.describe()}; measured vLLM kernels on {hardware.device.name}")
    if not report.fp8_break_even:
        console.print(f"FP8 break-even: no measured kernels for {report.model} on {hardware.name}")
    return 0


def handle_simulate(args: argparse.Namespace) -> int:
    import psutil

    from kvbench.cli.tables import print_summary, results_line
    from kvbench.engines.kvengine.settings.tenants import TenantsConfig, load_tenants
    from kvbench.measure.schedule import LoadSpec
    from kvbench.measure.stages import StagePlan
    from kvbench.sim.engine import SimConfig, simulate
    from kvbench.sim.geometry import load_geometry
    from kvbench.sim.hardware import load_hardware
    from kvbench.sim.presets import PRESETS, get_preset
    from kvbench.sim.run_folder import sim_entry, sim_point, write_sim_run
    from kvbench.workloads.profiles import load_workload

    try:
        geometry = load_geometry(args.model)
        hardware = fleet_hardware(load_hardware(args.hardware), args)
        presets = [fleet_preset(get_preset(name), args) for name in (args.preset or list(PRESETS))]
        plan, flag = None, _fleet_flags(args)
        load = LoadSpec(
            rate=args.rate,
            concurrency=args.concurrency,
            num_requests=args.num_requests,
            max_concurrency=flag["max_concurrency"],
        )
        tenants = load_tenants(args.tenants_file) if args.tenants_file else TenantsConfig()
        if flag["stages"] or flag["warmup_stage"]:
            if not flag["stages"]:
                raise SettingsError("--warmup-stage needs --stages (the measured stages after it)")
            if args.rate is not None or args.concurrency is not None:
                raise SettingsError("--stages sets the load: leave out --rate and --concurrency")
            plan = StagePlan(flag["stages"], flag["warmup_stage"])
    except ValueError as error:
        raise SettingsError(str(error)) from None
    num_sessions = args.num_sessions if plan is None or args.num_sessions else plan.total_requests
    workload = load_workload(
        args.workload,
        seed=args.seed,
        num_sessions=num_sessions,
        time_scale=args.time_scale,
        vocab_size=min(geometry.vocab_size, 32000),
    )
    run_dir = args.out or Path("runs") / f"sim-{Path(workload.name).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    results, said = [], []  # said: the assumption lines printed (one per way of pricing steps)
    for preset in presets:
        for kv_dtype in args.kv_dtype or ["fp8"]:
            try:
                config = SimConfig(
                    geometry,
                    hardware,
                    preset,
                    kv_dtype,
                    args.weight_dtype,
                    args.device_kv_tokens,
                    tenants=tenants,
                    memory_model=getattr(args, "memory_model", "reserve"),
                )
                config.check_memory(len(workload.sessions), psutil.virtual_memory().available)
                if (line := hardware.assumptions(config.cost.pricing)) not in said:
                    console.print(f"[yellow]{line}[/yellow]")
                    said.append(line)
                if plan is not None:
                    results += simulate_stage_entries(workload, plan, config, args.seed, flag["max_concurrency"])
                    continue
                result = simulate(
                    workload, load, config, run_id=sim_point(config, workload, load).run_id, seed=args.seed
                )
            except ValueError as error:
                raise SettingsError(str(error)) from None
            console.print(
                f"{preset.name} {kv_dtype}: {len(result.records)} requests, "
                f"{result.virtual_s:,.0f} s virtual in {result.wall_s:.1f} s (steps: {config.cost.pricing})"
            )
            results.append((result, sim_entry(result, workload, load, config)))
    doc = {
        "simulate": {
            "model": geometry.name,
            "hardware": hardware.name,
            "workload": args.workload,
            "num_sessions": args.num_sessions,
            "presets": [p.name for p in presets],
            "kv_dtypes": args.kv_dtype or ["fp8"],
            "load": load.label,
            "seed": args.seed,
            "time_scale": args.time_scale,
            "device_kv_tokens": args.device_kv_tokens,
            "tenants_file": args.tenants_file,
            "assumptions": "; ".join(said) or hardware.assumptions(),
            "nodes": presets[0].num_nodes,
            "route": presets[0].route,
            "page_size": presets[0].page_size,
            "max_num_seqs": presets[0].max_num_seqs,
            "max_num_batched_tokens": presets[0].max_step_tokens,
            "devices_per_node": hardware.num_devices,
            "memory_model": getattr(args, "memory_model", "reserve"),
            "stages": None if plan is None else [s.label for s in plan.stages],
            "max_concurrency": flag["max_concurrency"],
            "warmup_stage": None if plan is None or plan.warmup is None else plan.warmup.label,
        }
    }
    write_sim_run(run_dir, results, doc, plots=not args.no_plots)
    print_summary(run_dir)
    console.print(results_line(run_dir))
    return 0


def simulate_stage_entries(workload, plan, config, seed: int, max_concurrency: int | None = None) -> list:
    """One run folder entry per measured stage (its records only), the stage's rate (and the cap) as its load
    point."""
    import dataclasses

    from kvbench.measure.schedule import LoadSpec
    from kvbench.sim.run_folder import sim_entry, sim_point
    from kvbench.sim.staged import simulate_stages

    staged = simulate_stages(
        workload,
        plan,
        config,
        run_id=f"sim:{config.preset.name}/{config.kv_dtype}/stages",
        seed=seed,
        max_concurrency=max_concurrency,
    )
    console.print(
        f"{config.preset.name} {config.kv_dtype}: {len(staged.result.records):,} requests over "
        f"{len(plan.all_stages)} stages, {staged.result.virtual_s:,.0f} s virtual in "
        f"{staged.result.wall_s:.1f} s"
    )
    entries, seen = [], {}
    for stage, records, summary in zip(plan.stages, staged.stage_records, staged.stage_summaries()):
        load = LoadSpec(rate=stage.rate, duration_s=stage.duration_s, max_concurrency=max_concurrency)
        repeat = seen[load.label] = seen.get(load.label, -1) + 1
        run_id = sim_point(config, workload, load, repeat).run_id  # each stage a load point of its own
        result = dataclasses.replace(
            staged.result, records=tuple(dataclasses.replace(r, run_id=run_id) for r in records)
        )
        entry = sim_entry(result, workload, load, config, repeat=repeat)
        ttft = summary.ttft_ms
        console.print(
            f"  stage {stage.label}: {summary.completed} done, out {summary.output_tok_s or 0:,.0f} tok/s, "
            f"TTFT mean {ttft.mean if ttft else float('nan'):,.0f} ms, p90 "
            f"{ttft.p90 if ttft else float('nan'):,.0f} ms"
        )
        entries.append((result, entry))
    return entries
