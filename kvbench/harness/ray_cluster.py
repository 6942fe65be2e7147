"""`kvbench run --ray [ADDRESS]`: the experiment matrix and its load workers on a Ray cluster.

Ray does placement, start and the record stream, nothing else: the schedule, the oracle, the records and the
run folder are the same code as without Ray (`runner.py`, `workers.py`).

    driver (here)                                    Ray cluster
    open the run folder ---- one task per engine setting -> node with its `resources` (e.g. {GPU: 8}):
                                                        the adapter launches the engine there; each point's
                                                        load workers are Ray actors of a placement group
                                                        on that node when it has the CPUs
    requests.jsonl, summaries  <- records, entries, the engine's log, streamed back as they happen

Cells run in parallel wherever their resources fit; a cell that fails (its engine, or its task) fails alone
and its engine log still lands in the driver's run folder under engines/<label>/.

Clocks: every latency is a difference on one worker's own clock. The common start of a point's workers is a
wall-clock epoch, so machines' clocks are assumed synchronised (NTP/PTP); the self-check reports how far apart
the workers actually started (`client.start_spread_ms`), which includes any skew as the workers saw it.
Ray is optional (`pip install 'kvbench[ray]'`): nothing imports it until `--ray` is given.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.harness.config import EngineSpec, ExperimentConfig
from kvbench.harness.env import collect_env
from kvbench.harness.experiment import Experiment, Progress, RunOutcome
from kvbench.harness.workers import Done, Lost, Message, Ready, Sent, WorkerJob, WorkerStartError, play_reporting, ready
from kvbench.measure.metrics import ttft_values
from kvbench.measure.records import PointId, RecordWriter, RequestRecord
from kvbench.measure.report import write_plots, write_summaries
from kvbench.measure.run_folder import REQUESTS_JSONL, RunEntry, RunMode, engine_dir, write_config_and_env
from kvbench.measure.run_open import Resumed, open_run_dir
from kvbench.settings import SettingsError

RAY_MISSING = "--ray needs Ray, which is not installed: pip install 'kvbench[ray]'"
LOCAL = "local"  # --ray local: start a one-machine Ray cluster for this run
READY_TIMEOUT_S = 300.0
BATCH_S = 0.05  # how long an actor gathers records before it streams them back  # for a placement group or an actor to come up (a busy cluster queues them)


def import_ray():
    """The `ray` module, or SettingsError with the one line that says how to install it."""
    try:
        import ray
    except ImportError:
        raise SettingsError(RAY_MISSING) from None
    return ray


def connect(address: str):
    """Join the Ray cluster at `address` (`auto`: the one this machine belongs to; `local`: start one here),
    unless this process already did; SettingsError when there is none."""
    ray = import_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=None if address == LOCAL else address, log_to_driver=False)
        except ConnectionError as exc:
            raise SettingsError(
                f"--ray {address}: no Ray cluster found ({str(exc).splitlines()[0]}); start one "
                "(ray start --head, or a KubeRay RayCluster) or give --ray local"
            ) from None
    return ray


# --- load workers as Ray actors ------------------------------------------------------------------------------


class RayLoadWorker:
    """A load worker as a Ray actor: its own process and event loop; `play` streams its messages back."""

    def __init__(self, job: WorkerJob) -> None:
        self.job = job

    def ready(self) -> Ready:
        return ready(self.job)

    def play(self, start_at_s: float) -> Iterator[list[Message]]:
        """The job played on a thread's event loop; yields what it sent so far, in batches, until Done or Lost."""
        messages: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=play_reporting, args=(self.job, start_at_s, messages.put), daemon=True).start()
        while True:
            batch = [messages.get()]
            time.sleep(BATCH_S)  # gather a batch: each yield is work for Ray's threads, which share our GIL
            while not messages.empty():
                batch.append(messages.get())
            yield batch
            if isinstance(batch[-1], (Done, Lost)):
                return


@dataclass(slots=True)
class RayPool:
    """Workers as Ray actors, one CPU each, in a placement group: all on one node, `node_id` if it has the
    CPUs (else another), when given; else spread over the cluster."""

    node_id: str | None = None
    actors: dict[int, object] = field(default_factory=dict)  # worker -> actor handle, while launched
    _group: object = None
    _hosts: dict[int, str] = field(default_factory=dict)
    _streams: dict = field(default_factory=dict)

    def launch(self, jobs: Sequence[WorkerJob]) -> list[Ready]:
        ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = "STRICT_PACK" if self.node_id else "SPREAD"
        self._group = placement_group([{"CPU": 1}] * len(jobs), strategy=strategy, _soft_target_node_id=self.node_id)
        try:
            ray.get(self._group.ready(), timeout=READY_TIMEOUT_S)
            actor = ray.remote(num_cpus=1)(RayLoadWorker)
            for index, job in enumerate(jobs):
                placement = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index)
                self.actors[job.worker] = actor.options(scheduling_strategy=placement).remote(job)
            up = ray.get([handle.ready.remote() for handle in self.actors.values()], timeout=READY_TIMEOUT_S)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            raise WorkerStartError(f"load workers on Ray did not start: {str(exc).splitlines()[0]}") from None
        self._hosts = {message.worker: message.host for message in up}
        return up

    def go(self, start_at_s: float) -> None:
        self._streams = {handle.play.remote(start_at_s): worker for worker, handle in self.actors.items()}

    def events(self) -> Iterator[Sent | Done | Lost]:
        pending = dict(self._streams)
        for stream, worker, batch in stream_batches(import_ray(), pending):
            if isinstance(batch, StopIteration):
                yield Lost(
                    worker, f"load worker {worker} (Ray actor on {self._hosts.get(worker)}) ended without a result"
                )
            elif isinstance(batch, BaseException):
                yield Lost(
                    worker,
                    f"load worker {worker} (Ray actor on {self._hosts.get(worker)}) died: "
                    f"{type(batch).__name__}: {str(batch).splitlines()[0]}",
                )
            else:
                for message in batch:
                    if isinstance(message, (Done, Lost)):
                        del pending[stream]
                    yield message

    def close(self) -> None:
        if not self.actors and self._group is None:
            return
        ray = import_ray()
        from ray.util.placement_group import remove_placement_group

        for handle in self.actors.values():
            ray.kill(handle)
        self.actors.clear()
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None


# --- the matrix: one Ray task per engine setting -------------------------------------------------------------


def cell_options(engine: EngineSpec, workers: int) -> dict:
    """The Ray task options of an engine setting: its declared `resources`; a CPU of its own when it plays the
    load itself (one worker), none when its load workers are actors with CPUs of their own."""
    resources = dict(engine.resources)
    options = {"num_cpus": resources.pop("CPU", 1 if workers == 1 else 0), "num_gpus": resources.pop("GPU", 0)}
    if resources:
        options["resources"] = resources
    return options


@dataclass(frozen=True)
class _CellEnd:
    """A cell's last message: its failures and warnings, and its engine folder's files (the engine's log)."""

    failures: tuple[str, ...]
    warnings: tuple[str, ...]
    files: Mapping[str, bytes]


def run_cell(config: ExperimentConfig, index: int, resumed: Resumed) -> Iterator[list]:
    """The Ray task of engine setting `index`: the runner's own code for one engine, in a scratch run folder on
    this node; yields batches of what happens (points started, records, entries, messages) and then _CellEnd."""
    ray = import_ray()
    engine = config.engines[index]
    run_dir = Path(tempfile.mkdtemp(prefix="kvbench-cell-"))
    events: queue.SimpleQueue = queue.SimpleQueue()
    progress = Progress(
        on_point_start=lambda run_id, total: events.put(("start", run_id, total)),
        on_record=lambda record: events.put(("record", record)),
        on_point_end=lambda entry: events.put(("entry", entry)),
        on_message=lambda text: events.put(("message", text)),
    )
    outcome = RunOutcome(run_dir)
    # Load workers beside an engine that needs a node of its own; spread over the cluster otherwise (an endpoint).
    node = ray.get_runtime_context().get_node_id() if engine.resources else None

    def body() -> None:
        try:
            with RecordWriter(run_dir / REQUESTS_JSONL) as writer:
                Experiment(
                    config, run_dir, writer, progress, resumed, outcome, pool=lambda: RayPool(node_id=node)
                ).run_engine(index, engine)  # used for workers > 1
        except Exception as exc:  # noqa: BLE001 - the cell fails alone, and says why
            outcome.failures.append(f"{engine.label}: {traceback.format_exception_only(exc)[-1].strip()}")
        folder = engine_dir(run_dir, engine.label)
        files = (
            {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}
            if folder.exists()
            else {}
        )
        shutil.rmtree(run_dir, ignore_errors=True)  # everything in it went to the driver as events and files
        events.put(_CellEnd(tuple(outcome.failures), tuple(outcome.warnings), files))

    threading.Thread(target=body, daemon=True).start()
    while True:
        batch = [events.get()]
        time.sleep(BATCH_S)
        while not events.empty():
            batch.append(events.get())
        yield batch
        if isinstance(batch[-1], _CellEnd):
            return


def run_on_ray(config: ExperimentConfig, run_dir: Path, progress, mode: RunMode, address: str):
    """The matrix with every engine setting as a Ray task, into one run folder here (see the module doc)."""
    ray = connect(address)
    resumed = open_run_dir(run_dir, config.to_dict(), mode)
    write_config_and_env(run_dir, config.to_dict(), collect_env())
    outcome = RunOutcome(run_dir)
    ttfts: dict[str, list[float]] = {}
    for run_id, kept in resumed.records.items():  # the cells send only what they measure now
        _add_ttfts(ttfts, run_id, kept)
    cell = ray.remote(run_cell)
    streams = {
        cell.options(**cell_options(engine, config.client.workers)).remote(config, index, resumed): engine
        for index, engine in enumerate(config.engines)
    }
    with RecordWriter(run_dir / REQUESTS_JSONL) as writer:
        try:
            for stream, engine, batch in stream_batches(ray, streams):
                # The summaries change with an entry, a cell's end or a failed task; most batches are records only.
                changed = isinstance(batch, BaseException)
                if changed:
                    reason = str(batch).splitlines()[0] if str(batch) else "ended without a result"
                    outcome.failures.append(f"{engine.label}: its Ray task failed: {reason}")
                    progress.on_message(f"{engine.label} failed on Ray: {reason}")
                    batch = []
                for event in batch:
                    if isinstance(event, _CellEnd):
                        del streams[stream]
                        _cell_end(run_dir, engine, event, outcome)
                        changed = True
                    else:
                        _dispatch(event, writer, progress, outcome, ttfts)
                        changed = changed or event[0] == "entry"
                if changed:
                    write_summaries(run_dir, outcome.entries, [*outcome.failures, *outcome.warnings])
        finally:
            for stream in streams:  # interrupted: kill the cells still running (their engines die with them)
                with contextlib.suppress(TypeError, ValueError, ray.exceptions.RayError):
                    ray.cancel(stream, force=True)
            write_summaries(run_dir, outcome.entries, [*outcome.failures, *outcome.warnings])
    if outcome.entries:
        write_plots(run_dir, outcome.entries, ttfts)
    return outcome


def stream_batches(ray, streams: dict) -> Iterator[tuple[object, object, list | BaseException]]:
    """(stream, owner, batch) from Ray streaming generators as batches arrive, until `streams` (stream -> owner)
    is empty. A stream that ends (StopIteration) or fails (RayError) is dropped and yields that exception in
    place of a batch; a caller drops a stream it has seen the last message of by deleting it from `streams`."""
    while streams:
        ready, _ = ray.wait(list(streams), num_returns=1)
        for stream in ready:
            owner = streams[stream]
            try:
                batch = ray.get(next(stream))
            except (StopIteration, ray.exceptions.RayError) as exc:
                del streams[stream]
                yield stream, owner, exc
                continue
            yield stream, owner, batch


def _add_ttfts(ttfts: dict[str, list[float]], run_id: str, records: Sequence[RequestRecord]) -> None:
    """The TTFTs of one point's `records` into the TTFT plot's values of its engine."""
    ttfts.setdefault(PointId.parse(run_id).engine, []).extend(ttft_values(records))


def _dispatch(event: tuple, writer: RecordWriter, progress, outcome, ttfts: dict[str, list[float]]) -> None:
    kind = event[0]
    if kind == "record":
        record: RequestRecord = event[1]
        writer.write(record)
        _add_ttfts(ttfts, record.run_id, [record])
        progress.on_record(record)
    elif kind == "entry":
        entry: RunEntry = event[1]
        outcome.entries.append(entry)
        progress.on_point_end(entry)
    elif kind == "start":
        progress.on_point_start(event[1], event[2])
    else:
        progress.on_message(event[1])


def _cell_end(run_dir: Path, engine: EngineSpec, end: _CellEnd, outcome) -> None:
    outcome.failures.extend(end.failures)
    outcome.warnings.extend(end.warnings)
    folder = engine_dir(run_dir, engine.label)
    for name, data in end.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
