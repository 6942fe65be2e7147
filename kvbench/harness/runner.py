"""Runs an experiment matrix and writes its run folder as it goes.

For each engine setting: start it, wait until healthy; for each workload, load point and repetition: reset
the engine's prefix cache, scrape its counters, replay the workload, scrape again, and rewrite the summary
files. A failure of one engine setting is recorded and the next one runs; nothing measured is lost.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvbench.engines.base import EngineAdapter, EngineError
from kvbench.engines.prometheus import counter_deltas
from kvbench.engines.registry import engine_factory
from kvbench.harness import eventloop
from kvbench.harness.client import EndpointConfig
from kvbench.harness.config import EngineSpec, ExperimentConfig, WorkloadSpec
from kvbench.harness.env import collect_env
from kvbench.harness.loadgen import LoadGenerator, LoadResult
from kvbench.harness.metrics import ttft_ms, summarize_run
from kvbench.harness.reconcile import reconcile
from kvbench.harness.records import RecordWriter, RequestRecord
from kvbench.harness.report import REQUESTS_JSONL, write_plots, write_summaries
from kvbench.harness.schedule import LoadSpec
from kvbench.workloads.profiles import load_workload
from kvbench.workloads.spec import Workload


# Engine counters whose run deltas are kept beside the per-request sums.
SERVER_COUNTER_PREFIXES = ("vllm:", "sglang:", "lmcache:", "kvbench:", "trtllm_")


class UnreachableEngine(RuntimeError):
    """The first engine could not be reached before any load was sent (CLI exit code 2)."""


@dataclass(frozen=True)
class Progress:
    """Callbacks for a live display; the runner never prints."""

    on_point_start: Callable[[str, int], None] = lambda run_id, total_requests: None
    on_record: Callable[[RequestRecord], None] = lambda record: None
    on_point_end: Callable[[dict], None] = lambda entry: None
    on_message: Callable[[str], None] = lambda message: None  # plain text (labels contain brackets)


@dataclass(slots=True)
class RunOutcome:
    run_dir: Path
    entries: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def validate_experiment(config: ExperimentConfig) -> None:
    """Fail on bad names before anything starts: every engine adapter and every workload must resolve."""
    for engine in config.engines:
        engine_factory(engine.engine)
    for spec in config.workloads:
        load_workload(spec.name, seed=config.seed, num_sessions=1, overrides=spec.overrides, time_scale=spec.time_scale)


def run_experiment(config: ExperimentConfig, run_dir: Path, progress: Progress = Progress()) -> RunOutcome:
    validate_experiment(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    (run_dir / "env.json").write_text(json.dumps(collect_env(), indent=2))
    outcome = RunOutcome(run_dir)
    ttfts: dict[str, list[float]] = {}
    with RecordWriter(run_dir / REQUESTS_JSONL) as writer:
        for engine_index, engine in enumerate(config.engines):
            adapter = engine_factory(engine.engine)(engine.settings, run_dir / "engines" / _slug(engine.label))
            try:
                progress.on_message(f"starting {engine.label}")
                adapter.start()
                adapter.wait_healthy(config.client.health_timeout_s)
            except EngineError as exc:
                adapter.stop()
                if engine_index == 0 and engine.engine == "endpoint":
                    raise UnreachableEngine(str(exc)) from None
                outcome.failures.append(f"{engine.label}: {exc}")
                progress.on_message(f"{engine.label} failed to start: {str(exc).splitlines()[0]}")
                continue
            try:
                for workload_spec in config.workloads:
                    workload = _load_workload(workload_spec, config, adapter)
                    for load in config.load_specs():
                        for repeat in range(config.repeat):
                            entry = _run_point(config, engine, adapter, workload, workload_spec, load, repeat, writer, progress)
                            outcome.entries.append(entry)
                            ttfts.setdefault(engine.label, []).extend(entry.pop("_ttfts"))
                            write_summaries(run_dir, outcome.entries, outcome.failures)
                            progress.on_point_end(entry)
                            if entry["aborted"]:
                                outcome.failures.append(f"{entry['run_id']}: {entry['aborted']}")
                                raise _EngineGone(entry["aborted"])
            except _EngineGone:
                pass
            except EngineError as exc:
                outcome.failures.append(f"{engine.label}: {exc}")
            finally:
                adapter.stop()
    write_summaries(run_dir, outcome.entries, outcome.failures)
    if outcome.entries:
        write_plots(run_dir, outcome.entries, ttfts)
    return outcome


class _EngineGone(Exception):
    pass


def _load_workload(spec: WorkloadSpec, config: ExperimentConfig, adapter: EngineAdapter) -> Workload:
    vocab = getattr(adapter, "vocab_size", None)
    return load_workload(
        spec.name,
        seed=config.seed,
        num_sessions=spec.num_sessions,
        overrides=spec.overrides,
        vocab_size=vocab,
        time_scale=spec.time_scale,
    )


def _run_point(
    config: ExperimentConfig,
    engine: EngineSpec,
    adapter: EngineAdapter,
    workload: Workload,
    workload_spec: WorkloadSpec,
    load: LoadSpec,
    repeat: int,
    writer: RecordWriter,
    progress: Progress,
) -> dict:
    run_id = f"{engine.label}|{workload.name}|{load.label}|r{repeat}"
    reset = adapter.reset_cache() if adapter.capabilities.cache_reset else False
    before = adapter.scrape_metrics()
    endpoint = adapter.endpoint
    client = config.client
    generator = LoadGenerator(
        endpoint=EndpointConfig(
            base_url=endpoint.base_url,
            model=endpoint.model,
            api=client.api,
            api_key=endpoint.api_key,
            request_timeout_s=client.request_timeout_s,
            stall_timeout_s=client.stall_timeout_s,
            ignore_eos=client.ignore_eos,
        ),
        load=load,
        run_id=run_id,
        seed=config.seed + repeat,
        isolation=client.isolation,
        codec=_codec(client.tokenizer),
        max_lag_ms=client.max_lag_ms,
        tenant_api_keys=dict(client.tenant_api_keys),
    )
    total = min(workload.num_requests, load.num_requests or workload.num_requests)
    progress.on_point_start(run_id, total)
    started = time.time()
    result: LoadResult = eventloop.run(generator.run(workload, writer, progress.on_record))
    after = adapter.scrape_metrics()
    summary = summarize_run(result.records, config.slo)
    description = dict(adapter.describe())
    return {
        "run_id": run_id,
        "engine": engine.label,
        "engine_name": engine.engine,
        "engine_settings": dict(engine.settings),
        "kv_dtype": description.get("kv_dtype", "unknown"),
        "engine_description": description,
        "workload": workload.name,
        "workload_params": dict(workload.params),
        "load": load.label,
        "repeat": repeat,
        "started_at": started,
        "cache_reset": reset,
        "summary": summary.to_dict(),
        "client": result.client.to_dict(),
        "valid": result.client.valid and result.aborted is None,
        "aborted": result.aborted,
        "answer_sources": result.answer_sources,
        "reconciliation": reconcile(result.records, before, after).to_dict(),
        "server_counters": counter_deltas(before, after, SERVER_COUNTER_PREFIXES) if before and after else None,
        "_ttfts": [value for record in result.records if not record.warmup and (value := ttft_ms(record)) is not None],
    }


def _codec(tokenizer: str | None):
    if not tokenizer:
        return None
    from kvbench.harness.tokenizer import load_codec

    return load_codec(tokenizer)


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label).strip("_") or "engine"
