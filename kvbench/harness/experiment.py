"""One experiment's engine settings run in this process: start each engine, play its points, build each
point's entry and rewrite the summary files (the runner's loop for one engine setting).

`harness/runner.py` runs a whole matrix with it, here; `harness/ray_cluster.py` runs each engine setting with it
as a Ray task on a node of a cluster. Nothing here prints: `Progress` callbacks report what happens.

A staged load point's stages are consecutive points on the one server: the first resets its cache as every
point does, the ones after keep it (their entries say "warm cache") and are played by `harness/stage_play.py`.
"""

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.engines.base import EngineAdapter, EngineError
from kvbench.engines.http import request
from kvbench.engines.kv_capacity import kv_capacity, stated_prefill_budget
from kvbench.engines.prometheus import counter_deltas
from kvbench.engines.registry import engine_factory
from kvbench.harness import eventloop
from kvbench.harness.client import EndpointConfig
from kvbench.harness.config import EngineSpec, ExperimentConfig
from kvbench.harness.loadgen import ClientCheck, LoadGenerator, LoadResult
from kvbench.harness.possible_load import possible_load
from kvbench.harness.reconcile import cache_reasons, reconcile
from kvbench.harness.stage_play import StageChain, play_stage, stage_sessions
from kvbench.harness.stream_answer import DEFAULT_MAX_CONTEXT, breach_reason, stated_context
from kvbench.harness.workers import WorkerPool, run_on_workers
from kvbench.measure.conversation import Isolation
from kvbench.measure.metrics import failure_reason, ttft_values
from kvbench.measure.records import PointId, RecordWriter, RequestRecord
from kvbench.measure.report import write_summaries
from kvbench.measure.run_folder import INTERRUPTED, RunEntry, engine_dir, records_by_run
from kvbench.measure.run_open import Resumed
from kvbench.measure.schedule import LoadSpec
from kvbench.measure.write_errors import RunWriteError
from kvbench.workloads.spec import Workload

# Engine counters whose run deltas are kept beside the per-request sums.
SERVER_COUNTER_PREFIXES = ("vllm:", "sglang:", "lmcache:", "lmcache_mp_", "kvbench:", "trtllm_")


class UnreachableEngine(RuntimeError):
    """The first engine could not be reached before any load was sent (CLI exit code 2)."""


@dataclass(frozen=True)
class Progress:
    """Callbacks for a live display; the runner never prints."""

    on_point_start: Callable[[str, int], None] = lambda run_id, total_requests: None
    on_record: Callable[[RequestRecord], None] = lambda record: None
    on_point_end: Callable[[RunEntry], None] = lambda entry: None
    on_message: Callable[[str], None] = lambda message: None  # plain text (labels contain brackets)


@dataclass(slots=True)
class RunOutcome:
    """`failures` make the run fail (an engine that did not start, an aborted point, too many failed
    requests); `warnings` do not (e.g. an engine whose /metrics is not Prometheus text)."""

    run_dir: Path
    entries: list[RunEntry] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Point:
    """One measured point of the matrix: a workload at one load for one repetition."""

    id: PointId
    workload: Workload
    load: LoadSpec

    @property
    def total_requests(self) -> int:
        """What the point sends: a stage's sessions' turns (warm-up included), else up to the request budget."""
        staged = self.load.stage
        if staged is not None:
            return sum(len(session.turns) for session in stage_sessions(self.workload, staged))
        return min(self.workload.num_requests, self.load.num_requests or self.workload.num_requests)


def records_entry(
    point: PointId,
    records: Sequence[RequestRecord],
    config: ExperimentConfig,
    aborted: str | None,
    client: ClientCheck | None = None,
    resumed_at_ns: Sequence[int] = (),
) -> RunEntry:
    """The part of a point's entry that follows from its records and the config: identity, engine setting,
    summary, validity."""
    reasons = invalid_reasons(records, config.client.max_error_rate, client, aborted)
    engine = next((spec for spec in config.engines if spec.label == point.engine), None)
    return RunEntry.of(
        point,
        records,
        config.slo,
        reasons,
        aborted,
        resumed_at_ns,
        engine_name=engine.engine if engine else None,
        engine_settings=dict(engine.settings) if engine else {},
    )


CLIENT_LAG = "client lag: "  # the invalid reason of a point whose client fell behind (find_max reads it)


def invalid_reasons(
    records: Sequence[RequestRecord], max_error_rate: float, client: ClientCheck | None, aborted: str | None
) -> list[str]:
    """Why a point's numbers are not a measurement; empty when they are."""
    reasons = [f"aborted: {aborted}"] if aborted else []
    failed = failure_reason(records, max_error_rate)
    if failed:
        reasons.append(failed)
    breached = breach_reason(records)
    if breached:
        reasons.append(breached)
    if client is not None and not client.valid:
        reasons.append(f"{CLIENT_LAG}{client.reason}")
    return reasons


@dataclass(slots=True)
class Experiment:
    """One experiment being run: what its engines and points share."""

    config: ExperimentConfig
    run_dir: Path
    writer: RecordWriter
    progress: Progress
    resumed: Resumed
    outcome: RunOutcome
    ttfts: dict[str, list[float]] = field(default_factory=dict)
    warned_metrics: set[str] = field(default_factory=set)
    pool: Callable[[], WorkerPool] | None = None  # where a point's load workers run (None: processes here)
    helps: Mapping[tuple[str, ...], tuple[str, str] | None] = field(default_factory=dict)  # preflight's --help texts
    context: int = DEFAULT_MAX_CONTEXT  # the running engine's context window: the bound of its answers' usage
    stages: StageChain = field(default_factory=StageChain)  # the load ladder being played on the running engine

    def run_engine(self, index: int, engine: EngineSpec) -> None:
        adapter = engine_factory(engine.engine)(engine.settings, engine_dir(self.run_dir, engine.label))
        server = getattr(adapter, "server", None)
        if server is not None and server.plan.help_command and self.helps.get(tuple(server.plan.help_command)):
            server.help_text = self.helps[tuple(server.plan.help_command)][0]
        points = list(self._points(engine, adapter))
        if all(point.id.run_id in self.resumed.entries for point in points):
            for point in points:
                self._add(self.resumed.entries[point.id.run_id], self._finished(point))
            return
        if not self._start(index, engine, adapter):
            return
        try:
            for point in points:
                kept = self.resumed.entries.get(point.id.run_id)
                if kept is not None:
                    self._add(kept, self._finished(point))
                elif not self._measure(engine, adapter, point):
                    break  # the engine is gone: its other points cannot run
        except EngineError as exc:
            self.outcome.failures.append(f"{engine.label}: {exc}")
        finally:
            adapter.stop()

    def _points(self, engine: EngineSpec, adapter: EngineAdapter) -> Iterator[_Point]:
        """Per workload, each load point's repetitions in turn; a ladder's repetition is all its stages in order."""
        loads = self.config.load_specs()
        bounded = all(load.num_requests is not None and load.stage is None for load in loads)
        needed = max(load.num_requests + load.warmup_requests for load in loads) if bounded and loads else None
        for spec in self.config.workloads:
            workload = spec.load(self.config.seed, getattr(adapter, "vocab_size", None), needed)
            for ladder in _ladders(loads):
                for repeat in range(self.config.repeat):
                    for load in ladder:
                        possible, warnings = possible_load(load, workload)
                        for warning in warnings:
                            self._warn_once(warning)
                        yield _Point(PointId(engine.label, workload.name, load.label, repeat), workload, possible)

    def _warn_once(self, warning: str) -> None:
        if warning not in self.outcome.warnings:
            self.outcome.warnings.append(warning)
            self.progress.on_message(f"warning: {warning}")

    def _start(self, index: int, engine: EngineSpec, adapter: EngineAdapter) -> bool:
        try:
            self.progress.on_message(f"starting {engine.label}")
            adapter.start()
            adapter.wait_healthy(self.config.client.health_timeout_s)
            self.context = _context_window(adapter)
        except EngineError as exc:
            adapter.stop()
            if index == 0 and engine.engine == "endpoint":
                raise UnreachableEngine(str(exc)) from None
            self.outcome.failures.append(f"{engine.label}: {exc}")
            self.progress.on_message(f"{engine.label} failed to start: {str(exc).splitlines()[0]}")
            return False
        return True

    def _measure(self, engine: EngineSpec, adapter: EngineAdapter, point: _Point) -> bool:
        """Run one point and add its entry; False when it was aborted (the engine is gone)."""
        run_id = point.id.run_id
        finished = self._finished(point)
        keeps_cache = point.load.stage is not None and point.load.stage.keeps_cache
        reset = adapter.reset_cache() if adapter.capabilities.cache_reset and not keeps_cache else False
        before = self._scrape(engine, adapter)
        description = dict(adapter.describe())
        context = {
            "kv_dtype": description.get("kv_dtype", "unknown"),
            "engine_description": description,
            "workload_params": dict(point.workload.params),
            "started_at": time.time(),
            "cache_reset": reset,
            "clock_offset_ns": time.time_ns() - time.perf_counter_ns(),
        }
        self.progress.on_point_start(run_id, point.total_requests)
        generator = self._generator(adapter, point)
        try:
            result = self._play(generator, point, finished)
        except KeyboardInterrupt:
            records = records_by_run(self.run_dir).get(run_id, [])
            self._add(
                dataclasses.replace(records_entry(point.id, records, self.config, INTERRUPTED), **context), records
            )
            raise
        except RunWriteError as exc:  # the records on disk are the point's; run_experiment writes the summary
            records = records_by_run(self.run_dir).get(run_id, [])
            aborted = f"the run folder could not be written: {exc}"
            self.outcome.entries.append(
                dataclasses.replace(records_entry(point.id, records, self.config, aborted), **context)
            )
            raise
        after = self._scrape(engine, adapter)
        if result.missed_arrivals:
            self.progress.on_message(
                f"{run_id}: {result.missed_arrivals} request arrivals found every session busy or thinking, so fewer "
                f"requests/s were sent than asked (a workload with more sessions keeps up)"
            )
        records = [*result.replayed, *result.records]
        # A resumed point played in two sittings: its throughput counts the time each ran, not the pause between.
        sent_now = [record.sent_ns for record in result.records if record.sent_ns is not None]
        resumed_at = (min(sent_now),) if result.replayed and sent_now else ()
        entry = dataclasses.replace(
            records_entry(point.id, records, self.config, result.aborted, result.client, resumed_at),
            **context,
            client=result.client.to_dict(),
            # The server counted only what was sent now, not the replayed records.
            reconciliation=reconcile(result.records, before, after).to_dict(),
            server_counters=counter_deltas(before, after, SERVER_COUNTER_PREFIXES) if before and after else None,
            kv_capacity=_stated_capacity(before or after),
            prefill_beside_decodes=stated_prefill_budget(before or after),
        )
        breach = cache_reasons(entry.summary, reset)
        if breach:
            entry = dataclasses.replace(entry, valid=False, invalid_reasons=(*entry.invalid_reasons, *breach))
        self._add(entry, records)
        return result.aborted is None

    def _play(self, generator: LoadGenerator, point: _Point, finished: Sequence[RequestRecord]) -> LoadResult:
        """One worker in this process, as always; several as processes (or Ray actors) on one schedule."""
        client = self.config.client
        staged = point.load.stage
        if staged is not None:
            return play_stage(
                generator,
                point.workload,
                staged,
                self.config.seed + point.id.repeat,
                self.stages.oracle_for(staged, generator),
                self.writer,
                self.progress.on_record,
                finished,
            )
        if client.workers == 1:
            return eventloop.run(generator.run(point.workload, self.writer, self.progress.on_record, finished))
        return run_on_workers(
            generator,
            point.workload,
            client.workers,
            self.writer,
            self.progress.on_record,
            finished,
            tokenizer=client.tokenizer,
            pool=self.pool() if self.pool else None,
        )

    def _finished(self, point: _Point) -> Sequence[RequestRecord]:
        return self.resumed.records.get(point.id.run_id, ())

    def _generator(self, adapter: EngineAdapter, point: _Point) -> LoadGenerator:
        endpoint, client, sharing = adapter.endpoint, self.config.client, adapter.capabilities
        return LoadGenerator(
            endpoint=EndpointConfig(
                base_url=endpoint.base_url,
                model=endpoint.model,
                api=client.api,
                api_key=endpoint.api_key,
                request_timeout_s=client.request_timeout_s,
                header_timeout_s=client.header_timeout_s,
                first_byte_timeout_s=client.first_byte_timeout_s,
                stall_timeout_s=client.stall_timeout_s,
                ignore_eos=client.ignore_eos,
                max_context_tokens=self.context,
            ),
            load=point.load,
            run_id=point.id.run_id,
            seed=self.config.seed + point.id.repeat,
            isolation=client.isolation or Isolation.parse(sharing.isolation),
            shared_prefixes=sharing.shared_prefixes,
            codec=_codec(client.tokenizer),
            max_lag_ms=client.max_lag_ms,
            tenant_api_keys=dict(client.tenant_api_keys),
        )

    def _scrape(self, engine: EngineSpec, adapter: EngineAdapter) -> Mapping[str, float] | None:
        """The engine's counters, or None (missing, never 0) when its /metrics is absent or unreadable."""
        try:
            return adapter.scrape_metrics()
        except ValueError as exc:
            if engine.label not in self.warned_metrics:
                self.warned_metrics.add(engine.label)
                warning = f"{engine.label}: /metrics is {exc}: engine counters are not available"
                self.outcome.warnings.append(warning)
                self.progress.on_message(f"warning: {warning}")
            return None

    def _add(self, entry: RunEntry, records: Sequence[RequestRecord]) -> None:
        self.outcome.entries.append(entry)
        failed = entry.aborted or failure_reason(records, self.config.client.max_error_rate)
        if failed and not entry.interrupted:
            self.outcome.failures.append(f"{entry.run_id}: {failed}")
        self.ttfts.setdefault(entry.engine, []).extend(ttft_values(records))
        self.write_summaries()
        self.progress.on_point_end(entry)

    def write_summaries(self, best_effort: bool = False) -> None:
        """summary.{json,csv,md} of the entries so far; with `best_effort` (the folder already failed to take a
        write) a second failure is dropped, so that the first one is the error reported."""
        try:
            write_summaries(self.run_dir, self.outcome.entries, [*self.outcome.failures, *self.outcome.warnings])
        except RunWriteError:
            if not best_effort:
                raise


def _ladders(loads: Sequence[LoadSpec]) -> list[list[LoadSpec]]:
    """The loads in order, a staged load point's stages together (one ladder), every other load on its own."""
    out: list[list[LoadSpec]] = []
    for load in loads:
        if load.stage is not None and load.stage.keeps_cache and out:
            out[-1].append(load)
        else:
            out.append([load])
    return out


def _context_window(adapter: EngineAdapter) -> int:
    """The context window the engine states in /v1/models, else the client's general bound."""
    endpoint = adapter.endpoint
    reply = request("GET", endpoint.base_url.rstrip("/") + "/v1/models", timeout_s=10, api_key=endpoint.api_key)
    return (stated_context(reply.body, endpoint.model) if reply.ok else None) or DEFAULT_MAX_CONTEXT


def _stated_capacity(samples: Mapping[str, float] | None) -> dict | None:
    """The KV capacity the engine states on /metrics (tokens, bytes), not the setting it was given."""
    capacity = kv_capacity(samples)
    return capacity.to_dict() if capacity is not None else None


def _codec(tokenizer: str | None):
    if not tokenizer:
        return None
    from kvbench.harness.tokenizer import load_codec

    return load_codec(tokenizer)
