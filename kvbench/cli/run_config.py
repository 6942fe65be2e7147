"""`kvbench run`'s experiment config from its flags: CONFIG.yaml with flag overrides, or one built from flags
alone (the main job's two KV settings, an engine, an endpoint), sized to its workload (run_sizing.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from kvbench.cli import config_flags, vllm_bench_flags, vllm_flags
from kvbench.cli.run_sizing import size_to_workload
from kvbench.harness.config import load_config_file, parse_config
from kvbench.measure.stages import StagePlan
from kvbench.settings import SettingsError
from kvbench.workloads.text_datasets import needs_tokenizer

console = Console(soft_wrap=True)

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
            "label": main_job_label(engine, dtype),
            "settings": {**settings, "kv_dtype": dtype, "kv_capacity_bytes": MAIN_JOB_KV_BYTES},
        }
        for dtype in MAIN_JOB_KV_DTYPES
    ]


def main_job_label(engine: str, kv_dtype: str) -> str:
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
