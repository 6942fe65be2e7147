"""`kvbench calibrate` (fit a hardware profile to our engine's steps) and `kvbench validate-sim` (a real run
of our engine next to its simulation)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvbench.cli.flag_types import number_above
from kvbench.engines.kvengine.settings import openmp
from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig  # torch-free
from kvbench.engines.kvengine.settings.flags import add_flags, from_args
from kvbench.measure.run_folder import CONFIG_YAML, REQUESTS_JSONL, SIM_VALIDATION_JSON, SUMMARY_JSON
from kvbench.settings import SettingsError

console = Console()
# The engine settings a calibration needs, with `kvbench serve`'s names and defaults; the rest keep theirs.
CALIBRATE_ENGINE_FLAGS = ("model", "kv_dtype", "compute_dtype", "max_step_tokens", "threads")


def register(commands, formatter) -> None:
    cal = commands.add_parser(
        "calibrate",
        help="fit the simulator's hardware profile to our engine's measured step times",
        description="Fit the cost model's FLOP and bandwidth efficiencies and per-step overhead to our engine's "
        "measured steps, and write a hardware profile JSON for `kvbench simulate --hardware` and `kvbench "
        "validate-sim --hardware`. The steps come from the engine serving a real run (--steps: the "
        "engines/<label>/steps.jsonl every `kvbench run` of kvengine writes; this includes the load generator's "
        "share of the CPU; a run on a GPU logs the same file: `--steps it --hardware h200 --compute-dtype bfloat16` "
        "fits the H200 profile, whose efficiencies are otherwise assumptions) or, without --steps, from running the engine in this process on a fixed set of request "
        "shapes (prefills of 64-2048 tokens, decode batches of 1-8 sequences).",
        formatter_class=formatter,
    )
    cal.add_argument(
        "--steps",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a steps.jsonl logged by our engine during a run (repeatable); --model etc. must match it",
    )
    add_flags(cal, EngineConfig, only=CALIBRATE_ENGINE_FLAGS)  # as `kvbench serve` has them
    cal.add_argument(
        "--hardware", default="cpu", help="profile to start from (peaks, links); its efficiencies are refitted"
    )
    cal.add_argument("--geometry", help="simulator model geometry (default: from --model)")
    cal.add_argument(
        "--out", type=Path, default=None, help="profile JSON to write (default results/sim/<hardware>-calibrated.json)"
    )
    cal.add_argument(
        "--published",
        type=Path,
        nargs="+",
        metavar="CASE.yaml",
        help="fit to published GPU experiments instead (results/sim/published/*.yaml): one case: "
        "efficiencies, step overhead and router latency on one router's stages up to --max-rate, the "
        "rest checked; several cases of one GPU type: one step overhead and router latency across "
        "them (each case's --fit-router arm, else its first, at <= --max-rate; a closed loop's whole run)",
    )
    cal.add_argument("--fit-router", default="precise-prefix", help="with --published: the router fitted on")
    cal.add_argument("--max-rate", type=number_above(0), default=20.0, help="with --published: fit stages <= this")
    cal.add_argument(
        "--fit-throughput-at",
        type=number_above(0),
        action="append",
        default=[],
        metavar="RATE",
        help="with --published: also fit the output tok/s (only) of the fit router's stage at RATE, "
        "repeatable: a saturated stage, the one place large-batch steps show (its TTFT stays checked)",
    )
    cal.add_argument("--max-evaluations", type=int, default=24, help="with --published: simulations at most")
    cal.add_argument("--no-check", action="store_true", help="with --published: skip the check of the rest")
    cal.set_defaults(handler=handle_calibrate)

    val = commands.add_parser(
        "validate-sim",
        help="simulate a real run of our engine and compare: hit rates, TTFT p50/p99",
        description="For each run of our engine (kvengine) in RUN_DIR, simulate the same workload and load with "
        "the same cache and batching settings, sending requests in the order the real run sent them, on a "
        "(calibrated) hardware profile. Prints real and simulated metrics side by side and writes "
        f"RUN_DIR/{SIM_VALIDATION_JSON}. Exit 1 when the cache hit rates differ or TTFT p50/p99 differ by more than "
        "the tolerance.",
        formatter_class=formatter,
    )
    val.add_argument("run_dir", type=Path, help="a `kvbench run` folder with kvengine runs")
    val.add_argument(
        "--hardware",
        default="cpu",
        help="hardware profile: a `kvbench calibrate` JSON (fit it on your machine), or a profile name "
        "(default: cpu, fitted on kvbench's development machine)",
    )
    val.add_argument("--geometry", help="simulator model geometry (default: from the run's model setting)")
    val.add_argument("--tolerance", type=number_above(0), default=0.25, help="relative TTFT p50/p99 tolerance")
    val.set_defaults(handler=handle_validate)


def handle_calibrate(args: argparse.Namespace) -> int:
    if args.published is not None:
        from kvbench.cli.commands.calibrate_published_cmd import handle_published

        return handle_published(args)
    openmp.apply()  # before torch loads OpenMP
    import torch

    from kvbench.engines.kvengine.runtime.budget_probe import build_engine
    from kvbench.engines.kvengine.runtime.step_probe import probe_steps, read_step_log
    from kvbench.sim.calibrate import fit_hardware
    from kvbench.sim.hardware import load_hardware, save_hardware
    from kvbench.sim.validate import WEIGHT_DTYPES, engine_geometry

    config = from_args(EngineConfig, args, only=CALIBRATE_ENGINE_FLAGS)
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        hardware = load_hardware(args.hardware)
        geometry = engine_geometry(config.model, args.geometry)
        steps = [step for path in args.steps for step in read_step_log(path)]
    except (ValueError, OSError) as error:
        raise SettingsError(f"{error}") from None
    if not args.steps:
        engine = build_engine(config)
        console.print(
            f"probing {engine.model_name} ({config.kv_format.label} KV, {torch.get_num_threads()} threads)..."
        )
        steps = probe_steps(engine)
        engine.close()
    weight_dtype = WEIGHT_DTYPES.get(config.compute_dtype, "fp32")
    try:
        fit = fit_hardware(
            hardware,
            geometry,
            config.kv_dtype.value,
            weight_dtype,
            steps,
            padded_attention=False,
            page_size=config.page_size,
        )
    except ValueError as error:
        raise SettingsError(str(error)) from None
    source = (
        f"{len(steps)} steps of our engine logged in {', '.join(str(p) for p in args.steps)}"
        if args.steps
        else f"{len(steps)} steps of our engine probed in `kvbench calibrate`"
    )
    fit = dataclasses.replace(fit, hardware=dataclasses.replace(fit.hardware, fitted_on=f"{source} ({config.model})"))
    args.out = args.out or Path("results/sim") / f"{hardware.name}-calibrated.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_hardware(fit.hardware, args.out)

    _print_fit(fit, steps)
    console.print(f"profile: {args.out}")
    return 0


def _print_fit(fit, steps) -> None:
    """The measured steps against the fitted cost model, by kind of step (decode only, prefill only, mixed, all),
    then the fitted efficiencies and any that hit the profile's peak."""
    table = Table(title=f"{len(steps)} measured steps of our engine vs the fitted cost model")
    for column in ("steps", "count", "measured s", "predicted s", "predicted / measured"):
        table.add_column(column, justify="right")
    groups: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        computed = sum(b - a for a, b in step.work)
        kind = "decode only" if computed == len(step.work) else "prefill only" if len(step.work) == 1 else "mixed"
        groups.setdefault(kind, []).append(i)
    groups["all"] = list(range(len(steps)))
    for kind, members in groups.items():
        measured = sum(fit.measured_s[i] for i in members)
        predicted = sum(fit.predicted_s[i] for i in members)
        table.add_row(kind, str(len(members)), f"{measured:.2f}", f"{predicted:.2f}", f"{predicted / measured:.3f}")
    console.print(table)
    device = fit.hardware.device
    console.print(
        f"fitted: flops_efficiency {device.flops_efficiency:.3f} (of {device.flops_bf16 / 1e9:.0f} GFLOP/s), "
        f"bw_efficiency {device.bw_efficiency:.3f} (of {device.memory_bw / 1e9:.0f} GB/s), step overhead "
        f"{fit.hardware.step_overhead_s * 1e3:.1f} ms, overlap={device.overlap}"
    )
    for name in fit.at_bound():
        console.print(
            f"[yellow]warning: {name} hit 1.0: the profile's peak is below what the engine achieved; "
            "raise it in the profile[/yellow]"
        )


def handle_validate(args: argparse.Namespace) -> int:
    import yaml

    from kvbench.engines.kvengine.adapter import KVEngineSettings
    from kvbench.harness import config_schema
    from kvbench.harness.config import load_config_file
    from kvbench.measure.run_folder import read_entries, records_by_run
    from kvbench.sim.hardware import load_hardware
    from kvbench.sim.validate import (
        compare_records,
        engine_geometry,
        sim_config_for_engine,
        simulate_run,
        workload_name_matches,
    )
    from kvbench.workloads.profiles import load_workload

    run_dir: Path = args.run_dir
    for name in (CONFIG_YAML, SUMMARY_JSON, REQUESTS_JSONL):
        if not (run_dir / name).is_file():
            raise SettingsError(f"run_dir: {run_dir / name} is missing; give a folder written by `kvbench run`")
    experiment = load_config_file(run_dir / CONFIG_YAML)
    # the engine settings as the run had them (keys added since the run mean what they did then)
    written_version = (yaml.safe_load((run_dir / CONFIG_YAML).read_text()) or {}).get(config_schema.VERSION_KEY, 1)
    entries = [entry for entry in read_entries(run_dir) if entry.engine_name == "kvengine"]
    if not entries:
        raise SettingsError(f"run_dir: {run_dir} has no runs of our engine (kvengine); the simulator models it only")
    records = records_by_run(run_dir)
    try:
        hardware = load_hardware(args.hardware)
    except ValueError as error:
        raise SettingsError(f"--hardware: {error}; run `kvbench calibrate` first or name a profile") from None

    results, all_ok = [], True
    for entry in entries:
        try:
            # run_dir only names a disk tier folder, which a simulation never opens
            as_run = config_schema.kvengine_settings_as_run(entry.engine_settings, written_version)
            settings = KVEngineSettings.parse(as_run, run_dir).engine
            if settings.max_prefill_beside_decodes == AUTO and entry.prefill_beside_decodes:
                settings = dataclasses.replace(settings, max_prefill_beside_decodes=entry.prefill_beside_decodes)
            config = sim_config_for_engine(settings, engine_geometry(settings.model, args.geometry), hardware)
        except ValueError as error:
            raise SettingsError(f"{entry.run_id}: {error}") from None
        spec = next(w for w in experiment.workloads if workload_name_matches(w.name, entry.workload))
        load = next(spec for spec in experiment.load_specs() if spec.label == entry.load)
        workload = load_workload(
            spec.name,
            seed=experiment.seed,
            num_sessions=spec.num_sessions,
            overrides=spec.overrides,
            vocab_size=entry.workload_params.get("vocab_size"),
            time_scale=spec.time_scale,
        )
        real = records.get(entry.run_id, [])
        simulated = simulate_run(workload, load, config, real, seed=experiment.seed + entry.repeat)
        validation = compare_records(real, simulated.records, args.tolerance)
        all_ok &= validation.ok
        results.append({"run_id": entry.run_id, "hardware": hardware.name, **validation.to_dict()})
        _print_validation(entry.run_id, validation)
    (run_dir / SIM_VALIDATION_JSON).write_text(json.dumps({"hardware": args.hardware, "runs": results}, indent=2))
    console.print(f"written: {run_dir / SIM_VALIDATION_JSON}")
    return 0 if all_ok else 1


def _print_validation(run_id: str, validation) -> None:
    table = Table(
        title=f"{run_id}: real engine vs simulator "
        f"({validation.same_cached}/{validation.compared} requests with the same cached tokens)"
    )
    for column in ("metric", "real", "sim", "sim / real", "check"):
        table.add_column(column, justify="right")
    for row in validation.rows:
        check = {True: "ok", False: "[red]off[/red]", None: ""}[row.ok]
        if row.tolerance == 0.0 and row.ok is not None:
            check += " (equal)"
        elif row.tolerance and row.ok is not None:
            check += f" (±{row.tolerance:.0%})"
        table.add_row(row.name, _fmt(row.real), _fmt(row.sim), _fmt(row.ratio, 3), check)
    console.print(table)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"
