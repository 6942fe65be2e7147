"""`kvbench run`: one-off runs from flags, or an experiment matrix from YAML."""

from __future__ import annotations

import argparse
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from kvbench.cli import find_max_flags, vllm_bench_flags, vllm_flags
from kvbench.cli.live_progress import live_progress
from kvbench.cli.run_config import (  # noqa: F401 - config_from_args and the defaults are run's API (tests, tools)
    DEFAULT_ENGINE,
    DEFAULT_NUM_REQUESTS,
    MAIN_JOB_KV_BYTES,
    MAIN_JOB_KV_DTYPES,
    SIM_ENGINE,
    config_from_args,
    main_job_label,
)
from kvbench.cli.run_parser import add_flags
from kvbench.cli.tables import print_flags, print_summary, print_tradeoff, results_line
from kvbench.harness.runner import UnreachableEngine, run_experiment
from kvbench.measure.run_folder import (
    CONFIG_YAML,
    ENV_JSON,
    REQUESTS_JSONL,
    SUMMARY_CSV,
    SUMMARY_JSON,
    SUMMARY_MD,
    RunMode,
)
from kvbench.measure.stages import parse_stage, parse_stages
from kvbench.measure.write_errors import RunWriteError
from kvbench.settings import SettingsError

console = Console(soft_wrap=True)  # off a terminal its lines are not wrapped at 80 columns (tables still fit)
error_console = Console(stderr=True, soft_wrap=True)


def register(commands, formatter) -> None:
    parser = commands.add_parser(
        "run",
        help="run a workload against one or more engines and write a results folder",
        description="Run a workload against engines. With CONFIG.yaml, run its whole matrix (flags below then "
        f"override its seed/out/stop); without it, one run from flags. Results: OUT/{SUMMARY_MD}, {SUMMARY_CSV}, "
        f"{SUMMARY_JSON}, {REQUESTS_JSONL}, {CONFIG_YAML}, {ENV_JSON}, plots.",
        formatter_class=formatter,
    )
    add_flags(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.engine == SIM_ENGINE:
        return _simulate(args)
    config = config_from_args(args)
    run_dir = args.out or Path("runs") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.dry_run:
        from kvbench.harness.dry_run import print_dry_run

        return print_dry_run(config, run_dir, console, error_console, budget_min=args.budget)
    if args.budget is not None:
        from kvbench.harness.dry_run import budget_problem, plan_experiment

        over = budget_problem(plan_experiment(config, run_dir, use_installed=False), args.budget)
        if over:
            error_console.print(
                f"error: {over} (see it per cell: kvbench run ... --dry-run)", markup=False, highlight=False
            )
            return 2
    if args.find_max:
        return find_max_flags.run(args, config, run_dir, console)
    mode = RunMode.RESUME if args.resume else RunMode.OVERWRITE if args.overwrite else RunMode.FRESH
    console.print(f"[bold]kvbench run[/bold] -> {run_dir}")
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,  # off a terminal: live_progress's plain lines instead
    ) as bar:
        try:
            with _terminate_is_interrupt():
                outcome = run_experiment(
                    config, run_dir, live_progress(bar, args.progress_every), mode, ray_address=args.ray
                )
        except UnreachableEngine as exc:
            error_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False)
            return 2
        except RunWriteError as exc:  # one line; what was flushed stays, and the summary of it where it fit
            error_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False)
            return 1
    if (run_dir / SUMMARY_MD).exists():
        frame = print_summary(run_dir, _percentiles(args))
        labels = [main_job_label(DEFAULT_ENGINE, dtype) for dtype in MAIN_JOB_KV_DTYPES]
        if [engine.label for engine in config.engines] == labels:
            print_tradeoff(frame, *labels, f"the same {MAIN_JOB_KV_BYTES / 2**20:.0f} MiB of device KV")
    if (run_dir / SUMMARY_JSON).exists():  # the flags summary.md and the HTML report list (measure/flags.py)
        print_flags(console, run_dir)
    else:
        for failure in outcome.failures:
            console.print(f"[bold red]failed:[/bold red] {escape(failure)}", highlight=False)
    # 1 for any invalid point, whatever made it so (client lag too): a CI job reads only the exit code.
    invalid = [entry for entry in outcome.entries if not entry.valid]
    for path in vllm_bench_flags.save_results(args, run_dir, [entry.run_id for entry in outcome.entries]):
        console.print(f"vLLM result: {escape(str(path))}", highlight=False)
    console.print(results_line(run_dir))
    return 1 if outcome.failures or invalid or not outcome.entries else 0


def _percentiles(args: argparse.Namespace) -> dict[str, str]:
    """The percentile columns `--percentile-metrics`/`--metric-percentiles` select, their defaults without them
    (TTFT, TPOT and ITL at p50 and p99), as the flags' help says."""
    return vllm_flags.percentile_columns(args)


@contextlib.contextmanager
def _terminate_is_interrupt() -> Iterator[None]:
    """SIGTERM stops the run the way Ctrl-C does (the point in progress is summarised from the records on
    disk, the engine is stopped) instead of killing the driver and leaving its engine behind.

    Ctrl-C is made to work first: a process started in the background by a script inherits SIGINT ignored,
    and then neither Ctrl-C nor this SIGTERM would reach the run (asyncio only takes over SIGINT from its
    default handler)."""
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _simulate(args: argparse.Namespace) -> int:
    """`kvbench run --engine sim ...` is `kvbench simulate` with the run flags."""
    from kvbench.cli.commands.sim_cmd import handle_simulate

    if args.request_rate is not None or args.max_concurrency is not None:
        raise SettingsError(
            "--engine sim: the simulator plays --rate or --concurrency; --request-rate and "
            "--max-concurrency are for real engines"
        )
    if args.config is not None or args.url or args.duration_s is not None:
        raise SettingsError(
            "--engine sim: give flags (not CONFIG.yaml, --url or --duration); see kvbench simulate --help"
        )
    return handle_simulate(
        argparse.Namespace(
            model=args.sim_model,
            hardware=args.sim_hardware,
            workload=args.workload or "rag-chat",
            num_sessions=args.num_sessions,
            preset=args.sim_preset,
            kv_dtype=args.sim_kv_dtype,
            weight_dtype=None,
            device_kv_tokens=None,
            rate=args.rate,
            concurrency=args.concurrency,
            time_scale=1.0,
            num_requests=args.num_requests,
            seed=args.seed or 0,
            out=args.out,
            no_plots=False,
            tenants_file=None,
            stages=parse_stages(args.stages) if args.stages else None,
            warmup_stage=parse_stage(args.warmup_stage) if args.warmup_stage else None,
        )
    )
