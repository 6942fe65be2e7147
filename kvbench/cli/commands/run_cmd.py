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

from kvbench.cli import config_flags, find_max_flags, vllm_bench_flags, vllm_flags
from kvbench.cli.flag_types import at_least, checked_by, number_above
from kvbench.cli.live_progress import DEFAULT_EVERY_S, live_progress
from kvbench.cli.run_sizing import size_to_workload
from kvbench.cli.tables import print_flags, print_summary, print_tradeoff, results_line
from kvbench.harness.config import load_config_file, parse_config
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
from kvbench.measure.schedule import BURSTINESS_RANGE, MAX_CONCURRENCY, MAX_COUNT, MAX_RATE
from kvbench.measure.stages import STAGE_EXAMPLE, STAGE_GAP_S, StagePlan, parse_stage, parse_stages
from kvbench.measure.write_errors import RunWriteError
from kvbench.settings import SettingsError
from kvbench.workloads.text_datasets import needs_tokenizer

console = Console(soft_wrap=True)  # off a terminal its lines are not wrapped at 80 columns (tables still fit)
error_console = Console(stderr=True, soft_wrap=True)

# What `kvbench run` with no flags does: our engine, the default model, rag-chat-mini, a short run.
DEFAULT_ENGINE = "kvengine"
SIM_ENGINE = "sim"  # not an adapter: the discrete-event simulator, in virtual time
DEFAULT_WORKLOAD = "rag-chat-mini"
DEFAULT_CONCURRENCY = 4
DEFAULT_NUM_REQUESTS = 40
# The main job compares two KV settings of our engine in the same device KV bytes, fewer than the workload's
# working set (rag-chat-mini: ~11K distinct tokens; 256 MiB holds ~2.9K fp32 tokens of SmolLM2-135M and ~11.6K
# fp8_e4m3 ones), so the table shows what FP8 buys: cache hits kept, prefill not recomputed. It applies when no
# config, engine, URL or KV size/dtype is given; `--set kv_dtype=...` or `--set kv_capacity=...` runs one engine.
MAIN_JOB_KV_BYTES = 96 * 2**20
MAIN_JOB_KV_DTYPES = ("fp32", "fp8_e4m3")
MAIN_JOB_OVERRIDDEN_BY = ("kv_dtype", "kv_capacity", "kv_capacity_bytes")


def register(commands, formatter) -> None:
    parser = commands.add_parser(
        "run",
        help="run a workload against one or more engines and write a results folder",
        description="Run a workload against engines. With CONFIG.yaml, run its whole matrix (flags below then "
        f"override its seed/out/stop); without it, one run from flags. Results: OUT/{SUMMARY_MD}, {SUMMARY_CSV}, "
        f"{SUMMARY_JSON}, {REQUESTS_JSONL}, {CONFIG_YAML}, {ENV_JSON}, plots.",
        formatter_class=formatter,
    )
    _add_target_flags(parser)
    _add_load_flags(parser)
    config_flags.add_flags(parser)
    vllm_flags.add_report_flags(parser)
    find_max_flags.add_flags(parser)
    vllm_bench_flags.add_flags(parser)
    _add_run_flags(parser)
    _add_sim_flags(parser)
    parser.set_defaults(handler=handle)


def _add_target_flags(parser: argparse.ArgumentParser) -> None:
    """What is run: the config, or the engine, its settings and the workload."""
    parser.add_argument("config", nargs="?", type=Path, help="experiment matrix YAML (see kvbench/harness/config.py)")
    parser.add_argument("--engine", default=None, help="adapter name (default: kvengine, our own engine)")
    parser.add_argument("--url", help="base URL of a running OpenAI-compatible server (implies --engine endpoint)")
    parser.add_argument("--model", help="model name or path for the engine")
    parser.add_argument("--api-key", help="API key sent as a Bearer token")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine setting (repeatable), e.g. --set kv_dtype=fp8_e4m3; values are parsed as YAML; with "
        "CONFIG.yaml, it overrides that setting of every engine",
    )
    parser.add_argument(
        "--workload",
        default=None,
        help=f"profile name, trace/param file, or dataset: sharegpt:FILE (with --tokenizer), "
        f"dataset:PATH, random, prefix_repetition (default {DEFAULT_WORKLOAD})",
    )
    parser.add_argument(
        "--num-sessions", type=at_least(1, MAX_COUNT), help="sessions to generate (or trace rows to keep)"
    )


def _add_load_flags(parser: argparse.ArgumentParser) -> None:
    """The load point: one of an open loop, a closed loop, the trace's times or stages."""
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--rate",
        type=number_above(0, maximum=MAX_RATE),
        help="open loop: new SESSIONS per second (Poisson), each playing all its turns; for requests "
        "per second as vLLM counts them, use --request-rate",
    )
    load.add_argument(
        "--concurrency",
        type=at_least(1, MAX_CONCURRENCY),
        help=f"closed loop: requests in flight (default {DEFAULT_CONCURRENCY})",
    )
    load.add_argument("--trace-times", action="store_true", help="replay the workload's own arrival times")
    vllm_flags.add_load_flags(load, parser)
    load.add_argument(
        "--stages",
        type=checked_by(parse_stages),
        metavar="R:S,...",
        help=f"Poisson load stages RATE:SECONDS (e.g. {STAGE_EXAMPLE}), one after the other on one "
        f"server that keeps its cache, each drained before the next ({STAGE_GAP_S:g} s between); a "
        "row per stage; each request starts a session of the workload (--num-sessions defaults to "
        "their count)",
    )
    parser.add_argument(
        "--warmup-stage",
        type=checked_by(parse_stage),
        metavar="R:S",
        help="a stage before --stages, sent and recorded but left out of every result",
    )
    parser.add_argument(
        "--burstiness",
        type=number_above(BURSTINESS_RANGE[0], True, BURSTINESS_RANGE[1]),
        default=1.0,
        help="gamma shape for --rate or --request-rate (1.0 = Poisson; smaller is burstier), as vLLM's",
    )


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """How the run is carried out: where it runs, where it writes, what it prints."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="run on a Ray cluster (default address: auto): each engine setting as a Ray task on a "
        "node with its `resources`, the load workers as Ray actors (`local`: a one-machine cluster; put CONFIG.yaml "
        "first: kvbench run CONFIG.yaml --ray); needs pip install 'kvbench[ray]'",
    )
    parser.add_argument(
        "--progress-every",
        type=number_above(0),
        default=DEFAULT_EVERY_S,
        metavar="S",
        help=f"off a terminal (CI logs, pipes): a progress line every S seconds (default {DEFAULT_EVERY_S:g})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="results folder (default runs/<name>-<time>); one that holds a run is "
        "refused unless --resume or --overwrite is given",
    )
    reuse = parser.add_mutually_exclusive_group()
    reuse.add_argument(
        "--resume",
        action="store_true",
        help="finish the interrupted run in --out (same config): its finished requests are kept and not sent again",
    )
    reuse.add_argument(
        "--overwrite", action="store_true", help="replace the run in --out (its files are removed first)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print every cell's command line, environment, "
        "generated files and load plan, checked against the engine's --help; launch nothing "
        "(exit 2 on a flag the targeted version lacks)",
    )
    parser.add_argument(
        "--cell",
        action="append",
        default=[],
        metavar="LABEL",
        help="with CONFIG.yaml, run only this engine cell (repeatable): a cell's label, e.g. "
        "'vllm-prefix[kv_cache_dtype=auto]', or an engine's label for all its swept cells",
    )
    parser.add_argument(
        "--budget",
        type=number_above(0),
        metavar="MINUTES",
        help="refuse (exit 2) a plan whose cells' load, one after another, needs more than MINUTES "
        "(the dry run's total; e.g. the CI job's timeout-minutes)",
    )


def _add_sim_flags(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group("simulated engine (--engine sim; see `kvbench simulate --help`)")
    sim.add_argument("--sim-model", default="qwen2.5-72b", help="model geometry to simulate")
    sim.add_argument("--sim-hardware", default="8xh200", help="hardware profile to simulate")
    sim.add_argument("--sim-preset", action="append", default=[], help="policy preset, repeatable (default: all)")
    sim.add_argument("--sim-kv-dtype", action="append", default=[], help="KV dtype, repeatable (default fp8)")


def config_from_args(args: argparse.Namespace):
    """The experiment config: the YAML file with flag overrides, or one built from flags alone."""
    vllm_bench_flags.check(args)
    settings = _engine_settings(args)
    data = _from_config_file(args, settings) if args.config is not None else _from_flags(args, settings)
    data.setdefault("slo", {}).update(vllm_flags.goodput_slo(args))  # then --slo-*-ms, given below, win
    for key, values in config_flags.given(args).items():
        section = data if key == "" else data.setdefault(key, {})
        section.update(values)
    stop = data.setdefault("stop", {})
    if args.num_requests is not None:  # one stop condition replaces the other
        stop["duration_s"] = None
    if args.duration_s is not None:
        stop["num_requests"] = None
    config = parse_config(data, where=str(args.config) if args.config else "flags")
    if args.config is not None:
        return config
    return size_to_workload(
        config, args, DEFAULT_NUM_REQUESTS, lambda line: console.print(f"note: {line}", markup=False, highlight=False)
    )


def _engine_settings(args: argparse.Namespace) -> dict:
    """`--set KEY=VALUE` as {key: YAML value}."""
    import yaml

    settings = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SettingsError(f"--set {item!r}: expected KEY=VALUE, e.g. --set kv_dtype=fp8_e4m3")
        settings[key.strip()] = yaml.safe_load(value)
    return settings


def _from_config_file(args: argparse.Namespace, settings: dict) -> dict:
    """CONFIG.yaml's mapping, `--set` applied to every engine and a load flag replacing its load points."""
    data = load_config_file(args.config).to_dict()
    for engine in data["engines"]:  # --set overrides every engine setting of the matrix
        engine["settings"] = {**engine["settings"], **settings}
    if args.cell:
        data["engines"] = _cells(data["engines"], args.cell, args.config)
    _endpoint_cells(data["engines"], args)
    _refuse_matrix_flags(args)
    _refuse_stop_flags_with_stages(args)
    if _load_asked(args):  # a load flag replaces the config's load points, as --num-requests its stop
        data["loads"] = [_load_point(args)]
    if args.num_sessions is not None:
        for workload in data["workloads"]:
            workload["num_sessions"] = args.num_sessions
    return data


def _from_flags(args: argparse.Namespace, settings: dict) -> dict:
    """The config mapping of a run from flags alone: one engine (or the main job's two), one workload, one load."""
    if args.cell:
        raise SettingsError(
            "--cell: selects cells of CONFIG.yaml; give the config first (kvbench run CONFIG.yaml --cell LABEL)"
        )
    url, api = vllm_bench_flags.server(args)
    if url and args.url and url != args.url:
        raise SettingsError(f"--url {args.url} and vllm bench serve's server flags ({url}) name two servers: give one")
    url = args.url or url
    engine = args.engine or ("endpoint" if url else DEFAULT_ENGINE)
    for key, value in (("url", url), ("model", args.served_model_name or args.model), ("api_key", args.api_key)):
        if value:
            settings.setdefault(key, value)
    _refuse_stop_flags_with_stages(args)
    dataset = vllm_bench_flags.workload(args)
    workload = dataset or {"name": args.workload or DEFAULT_WORKLOAD}
    if dataset is not None and args.num_sessions is None and not args.stages:  # vLLM: a prompt per request
        workload["num_sessions"] = args.num_requests or DEFAULT_NUM_REQUESTS
    if args.tokenizer and needs_tokenizer(workload["name"]):
        workload.setdefault("overrides", {})["tokenizer"] = args.tokenizer  # a text dataset is tokenized with it
    if args.num_sessions is not None:
        workload["num_sessions"] = args.num_sessions
    elif args.stages:  # a session for every request of the stages, as `kvbench simulate --stages` makes
        workload["num_sessions"] = _stage_plan(args).total_requests
    return {
        "name": Path(workload["name"].split(":", 1)[-1]).stem,
        "engines": _engines(engine, settings, main_job=not (args.engine or url)),
        "workloads": [workload],
        # vLLM's dataset flags without a load flag: vLLM's default, every request as soon as it is ready
        "loads": [{"request_rate": "inf"} if dataset is not None and not _load_asked(args) else _load_point(args)],
        "stop": {"num_requests": DEFAULT_NUM_REQUESTS},
        "client": {"api": api} if api else {},
    }


def _cells(engines: list[dict], wanted: list[str], config: Path) -> list[dict]:
    """The engine cells `--cell` names (a cell label, or the base label of swept cells), in the config's order."""
    labels = [engine["label"] for engine in engines]
    for label in wanted:
        if not any(label in (cell, cell.split("[")[0]) for cell in labels):
            raise SettingsError(f"--cell {label!r}: {config} has no such cell; its cells: {', '.join(labels)}")
    return [engine for engine in engines if {engine["label"], engine["label"].split("[")[0]} & set(wanted)]


def _engines(engine: str, settings: dict, main_job: bool) -> list[dict]:
    """The flag-built run's engine entries: the main job's KV comparison, or the one engine as asked."""
    if not main_job or any(key in settings for key in MAIN_JOB_OVERRIDDEN_BY):
        return [{"engine": engine, "settings": settings}]
    return [
        {
            "engine": engine,
            "label": _main_job_label(engine, dtype),
            "settings": {**settings, "kv_dtype": dtype, "kv_capacity_bytes": MAIN_JOB_KV_BYTES},
        }
        for dtype in MAIN_JOB_KV_DTYPES
    ]


def _main_job_label(engine: str, kv_dtype: str) -> str:
    return f"{engine}-{kv_dtype}"


ENDPOINT_FLAGS = (("--url", "url"), ("--model", "model"), ("--api-key", "api_key"))


def _endpoint_cells(engines: list[dict], args: argparse.Namespace) -> None:
    """`--url`/`--model`/`--api-key` with CONFIG.yaml set those settings of its endpoint cells (a running server
    the config leaves open, e.g. the same matrix against another host); a config without one refuses them."""
    given = {key: getattr(args, key) for _, key in ENDPOINT_FLAGS if getattr(args, key)}
    if not given:
        return
    cells = [engine for engine in engines if engine["engine"] == "endpoint"]
    if not cells:
        flags = ", ".join(flag for flag, key in ENDPOINT_FLAGS if key in given)
        raise SettingsError(
            f"{flags}: set an endpoint cell's settings and {args.config} has none (engine: endpoint); set it in "
            "the config (an engine setting of every cell: --set KEY=VALUE), or drop CONFIG.yaml to run from flags"
        )
    for cell in cells:
        cell["settings"] = {**cell["settings"], **given}


def _refuse_matrix_flags(args: argparse.Namespace) -> None:
    """With CONFIG.yaml its engines and workloads are the matrix: a flag that would name another is refused, never
    silently dropped."""
    for flag, value in (
        ("--engine", args.engine),
        ("--workload", args.workload),
        ("--dataset-name", args.dataset_name),
        ("--base-url", args.base_url),
        ("--host", args.host),
        ("--port", args.port),
        ("--backend", args.backend),
        ("--endpoint", args.endpoint),
    ):
        if value:
            raise SettingsError(
                f"{flag}: CONFIG.yaml names the engines and workloads; set it in {args.config} "
                "(an engine setting of every cell: --set KEY=VALUE), or drop CONFIG.yaml to run from flags"
            )


def _load_asked(args: argparse.Namespace) -> bool:
    return any(
        value is not None
        for value in (args.rate, args.concurrency, args.request_rate, args.max_concurrency, args.stages)
    ) or bool(args.trace_times)


def _refuse_stop_flags_with_stages(args: argparse.Namespace) -> None:
    """The stages are the load and its stop: a flag that would set another is refused, never silently dropped."""
    if args.warmup_stage and not args.stages:
        raise SettingsError("--warmup-stage needs --stages (the measured stages after it)")
    if not args.stages:
        return
    for flag, value in (
        ("--max-concurrency", args.max_concurrency),
        ("--num-requests", args.num_requests),
        ("--duration", args.duration_s),
        ("--warmup", args.warmup_requests),
        ("--find-max", args.find_max),
        ("--workers", args.workers if args.workers != 1 else None),
    ):
        if value is not None:
            raise SettingsError(
                f"{flag}: --stages sets the load, its stop and its warm-up (--warmup-stage); leave out {flag}"
            )


def _stage_plan(args: argparse.Namespace) -> StagePlan:
    return StagePlan.parse(args.stages, args.warmup_stage)


def _load_point(args: argparse.Namespace) -> dict:
    if args.stages:
        return {"stages": args.stages, "warmup_stage": args.warmup_stage}
    vllm = vllm_flags.load_point(args)
    if vllm is not None:
        return vllm
    if args.rate is not None:
        return {"rate": args.rate, "burstiness": args.burstiness}
    if args.trace_times:
        return {}
    return {"concurrency": DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency}


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
        labels = [_main_job_label(DEFAULT_ENGINE, dtype) for dtype in MAIN_JOB_KV_DTYPES]
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
