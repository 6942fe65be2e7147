"""Several load workers for one point: `kvbench run --workers N` (processes here) and `--ray` (Ray actors).

One Python process saturates its event loop long before a cluster's engines do, so a point can be played by
N workers, each a process with its own event loop running the same `LoadGenerator` on its own sessions:

    driver: session_offsets -> split_schedule -> one WorkerJob per worker
            launch (every worker says Ready with its clock) -> go(start epoch) -> Sent records ... Done
    worker: LoadGenerator.run(its sessions, their offsets, start_at_s) -> each record back as it finishes

- One schedule. The driver fixes every session's start offset once (`session_offsets`, as one worker would)
  and deals whole sessions to workers (`split_schedule`): a session never spans workers, so its next turn
  carries its real answer as it does with one worker. A closed loop's concurrency and the request budget are
  split exactly. The common start is a wall-clock epoch, the only time that means the same on every machine:
  we assume the machines' clocks are synchronised (NTP/PTP, typically well under a millisecond on one
  network), and each worker reports how late it started against that epoch (`start_spread_ms`).
- One clock per latency. Every timestamp of a record is taken by the worker that sent it; the driver moves
  the record onto its own perf_counter by that worker's wall-clock offset (`RequestRecord.shift_times`), which
  keeps each latency exact and makes spans across workers (a run's duration) as good as the clock sync.
- One oracle. `reusable_tokens` depends on every earlier prompt of every session, which no single worker
  sees: the driver replays each record into one `ConversationDriver` as it arrives (the code a resumed run
  replays with) and writes the record with its reusable tokens. Records arrive in completion order, so with
  several workers the oracle observes prompts in that order rather than in send order (one worker is unchanged).
- One run folder. Records land in the driver's requests.jsonl as they finish; the self-check pools every
  worker's schedule and loop lag and keeps each worker's own: the point is invalid if any worker fell behind.
  A worker that dies aborts the point, names the worker, and every record it sent before is on disk.

Processes are started with `spawn` (no state of the driver, its threads or its event loop is inherited).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvbench.harness import eventloop
from kvbench.harness.loadgen import LoadGenerator, LoadResult
from kvbench.measure.conversation import ConversationDriver
from kvbench.measure.record_builder import with_reusable_tokens
from kvbench.measure.records import RecordWriter, RequestRecord
from kvbench.measure.schedule import session_offsets, split_schedule
from kvbench.workloads.spec import Workload

# Between the last worker's Ready and the common start: time to send `go` and open connections.
START_MARGIN_S = 0.5


def clock_offset_ns() -> int:
    """This process's wall clock minus its perf_counter: what turns its perf_counter into an epoch."""
    return time.time_ns() - time.perf_counter_ns()


@dataclass(frozen=True)
class WorkerJob:
    """What one worker plays: its sessions (a workload of only those), their start offsets from the common
    start and its share of the load (in `generator.load`); `tokenizer` is loaded by the worker itself."""

    worker: int
    generator: LoadGenerator
    workload: Workload
    offsets: tuple[float, ...]
    finished: tuple[RequestRecord, ...] = ()
    tokenizer: str | None = None


@dataclass(frozen=True)
class Ready:
    """A worker is up: where it runs and its clock (`clock_offset_ns`)."""

    worker: int
    host: str
    pid: int
    clock_offset_ns: int


@dataclass(frozen=True)
class Sent:
    """A record a worker finished (its own clock)."""

    worker: int
    record: RequestRecord


@dataclass(frozen=True)
class Done:
    """A worker's end: its result without the records, which came as `Sent`."""

    worker: int
    result: LoadResult


@dataclass(frozen=True)
class Lost:
    """A worker that ended without `Done` (killed, crashed): `reason` names it."""

    worker: int
    reason: str


Message = Ready | Sent | Done | Lost


class WorkerStartError(RuntimeError):
    """A worker did not come up; the message names it and why."""


def play(job: WorkerJob, start_at_s: float, emit: Callable[[Message], None]) -> None:
    """The worker's side, wherever it runs: play the job on a fresh event loop of this process, emitting every
    record as it finishes and then `Done`."""
    generator = job.generator
    if job.tokenizer:
        from kvbench.harness.tokenizer import load_codec

        generator = dataclasses.replace(generator, codec=load_codec(job.tokenizer))
    result = eventloop.run(
        generator.run(
            job.workload,
            on_record=lambda record: emit(Sent(job.worker, record)),
            finished=job.finished,
            offsets=job.offsets,
            start_at_s=start_at_s,
        )
    )
    emit(Done(job.worker, dataclasses.replace(result, records=(), replayed=())))


class WorkerPool(Protocol):
    """Where workers run (processes here, Ray actors): it starts them, starts their clocks and streams back
    what they send. Nothing else: the schedule, the oracle and the records are the driver's."""

    def launch(self, jobs: Sequence[WorkerJob]) -> list[Ready]:
        """Start one worker per job; return once every one is Ready (WorkerStartError names one that is not)."""

    def go(self, start_at_s: float) -> None:
        """Tell every worker the common start (a wall-clock epoch)."""

    def events(self) -> Iterator[Sent | Done | Lost]:
        """What the workers send, as it comes, until every worker is Done or Lost."""

    def close(self) -> None:
        """Stop whatever still runs (after an interrupt); safe to call twice."""


@dataclass(slots=True)
class ProcessPool:
    """Workers as processes of this machine (`spawn`ed, one pipe each), each on a CPU of its own where there
    are plenty (`worker_cpus`)."""

    context: str = "spawn"
    _workers: list = field(default_factory=list)  # (job, process, pipe) while launched

    def launch(self, jobs: Sequence[WorkerJob]) -> list[Ready]:
        context = multiprocessing.get_context(self.context)
        cpus = worker_cpus(len(jobs), sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [])
        for job, cpu in zip(jobs, cpus):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_process_main, args=(theirs, job, cpu), name=f"kvbench-load-{job.worker}", daemon=True
            )
            process.start()
            theirs.close()
            self._workers.append((job, process, ours))
        ready = []
        for job, process, pipe in self._workers:
            message = _receive(pipe, job.worker, process)
            if not isinstance(message, Ready):
                raise WorkerStartError(
                    message.reason if isinstance(message, Lost) else f"worker {job.worker}: {message}"
                )
            ready.append(message)
        return ready

    @property
    def pids(self) -> dict[int, int]:
        """Worker -> process id, while launched."""
        return {job.worker: process.pid for job, process, _ in self._workers}

    def go(self, start_at_s: float) -> None:
        for _, _, pipe in self._workers:
            pipe.send(start_at_s)

    def events(self) -> Iterator[Sent | Done | Lost]:
        open_pipes = {pipe: (job, process) for job, process, pipe in self._workers}
        while open_pipes:
            for pipe in multiprocessing.connection.wait(list(open_pipes)):
                job, process = open_pipes[pipe]
                message = _receive(pipe, job.worker, process)
                if isinstance(message, (Done, Lost)):
                    del open_pipes[pipe]
                yield message

    def close(self) -> None:
        for _, process, pipe in self._workers:
            if process.is_alive():
                process.terminate()
            process.join(timeout=5)
            pipe.close()
        self._workers.clear()


def worker_cpus(workers: int, cpus: Sequence[int]) -> list[int | None]:
    """A CPU per worker, from the top of `cpus`, when there are at least twice as many CPUs as workers (the
    rest stay for the driver, and for an engine or instrument on this machine); else None each (the OS places
    them)."""
    if len(cpus) < 2 * workers:
        return [None] * workers
    return [cpus[-1 - index] for index in range(workers)]


def _receive(pipe: multiprocessing.connection.Connection, worker: int, process) -> Message:
    try:
        return pipe.recv()
    except (EOFError, OSError):
        process.join(timeout=5)
        return Lost(worker, f"load worker {worker} (pid {process.pid}) died: exit code {process.exitcode}")


def ready(job: WorkerJob) -> Ready:
    """This process, as the worker of `job`."""
    return Ready(job.worker, socket.gethostname(), os.getpid(), clock_offset_ns())


def play_reporting(job: WorkerJob, start_at_s: float, emit: Callable[[Message], None]) -> None:
    """`play`, with a crash sent back as Lost (the driver must hear it, not a silent end)."""
    try:
        play(job, start_at_s, emit)
    except Exception as exc:  # noqa: BLE001 - whatever it was
        last = traceback.format_exception_only(exc)[-1].strip()
        emit(Lost(job.worker, f"load worker {job.worker} (pid {os.getpid()} on {socket.gethostname()}) failed: {last}"))


def _process_main(pipe: multiprocessing.connection.Connection, job: WorkerJob, cpu: int | None = None) -> None:
    """A worker process: Ready, wait for the start epoch, play, Done (or Lost)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it stops its workers
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    pipe.send(ready(job))
    play_reporting(job, pipe.recv(), pipe.send)
    pipe.close()


def plan_jobs(
    generator: LoadGenerator,
    workload: Workload,
    workers: int,
    finished: Sequence[RequestRecord] = (),
    tokenizer: str | None = None,
) -> list[WorkerJob]:
    """The driver's one schedule dealt into one job per worker (see `split_schedule`)."""
    sessions = workload.sessions
    offsets = session_offsets(generator.load, [session.arrival_s for session in sessions], generator.seed)
    shares = split_schedule(generator.load, offsets, [len(session.turns) for session in sessions], workers)
    jobs = []
    for share in shares:
        own = {sessions[index].session_id for index in share.sessions}
        jobs.append(
            WorkerJob(
                worker=share.worker,
                # Its own seed: at a request rate each worker draws its own arrivals (offsets are fixed above).
                generator=dataclasses.replace(
                    generator, load=share.load, codec=None, seed=generator.seed + share.worker
                ),
                workload=dataclasses.replace(workload, sessions=tuple(sessions[index] for index in share.sessions)),
                offsets=share.offsets,
                finished=tuple(record for record in finished if record.session_id in own),
                tokenizer=tokenizer,
            )
        )
    return jobs


def run_on_workers(
    generator: LoadGenerator,
    workload: Workload,
    workers: int,
    writer: RecordWriter | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    finished: Sequence[RequestRecord] = (),
    tokenizer: str | None = None,
    pool: WorkerPool | None = None,
) -> LoadResult:
    """Play one point on `workers` workers of `pool` (processes of this machine by default); the result is one
    worker's result for the whole point. `generator` is the point's generator as one worker would run it."""
    pool = pool if pool is not None else ProcessPool()
    jobs = plan_jobs(generator, workload, workers, finished, tokenizer)
    conversations = ConversationDriver(generator.run_id, generator.load, generator.new_oracle())
    talks = {session.session_id: conversations.start(session) for session in workload.sessions}
    for record in sorted(finished, key=lambda r: (r.sent_ns or 0, r.session_id, r.turn)):
        talks[record.session_id].replay(record)
    driver_offset = clock_offset_ns()
    records: list[RequestRecord] = []
    results: dict[int, LoadResult] = {}
    lost: list[str] = []
    try:
        try:
            ready = {message.worker: message for message in pool.launch(jobs)}
        except WorkerStartError as exc:
            return _pooled(generator, jobs, results, [str(exc)], records, finished)
        pool.go(time.time() + START_MARGIN_S)
        for message in pool.events():
            if isinstance(message, Sent):
                record = message.record
                record.shift_times(ready[message.worker].clock_offset_ns - driver_offset)
                record = with_reusable_tokens(record, talks[record.session_id].replay(record))
                records.append(record)
                if writer is not None:
                    writer.write(record)
                if on_record is not None:
                    on_record(record)
            elif isinstance(message, Done):
                results[message.worker] = message.result
            else:
                lost.append(message.reason)
    finally:
        pool.close()
    return _pooled(generator, jobs, results, lost, records, finished)


def _pooled(
    generator: LoadGenerator,
    jobs: Sequence[WorkerJob],
    results: dict[int, LoadResult],
    lost: list[str],
    records: list[RequestRecord],
    finished: Sequence[RequestRecord],
) -> LoadResult:
    """One point's result from its workers': lags pooled and per worker, the first abort, every loss."""
    done = [results[job.worker] for job in jobs if job.worker in results]
    pooled = generator.check(
        [lag for result in done for lag in result.schedule_lags_ms],
        [lag for result in done for lag in result.loop_lags_ms],
        records,
    )
    behind = [
        f"worker {job.worker}: {results[job.worker].client.reason}"
        for job in jobs
        if job.worker in results and not results[job.worker].client.valid
    ]
    starts = [result.client.start_offset_ms for result in done if result.client.start_offset_ms is not None]
    reason = pooled.reason or (behind[0] if behind else None)
    client = dataclasses.replace(
        pooled,
        valid=reason is None,
        reason=reason,
        workers=tuple(result.client for result in done),
        start_spread_ms=max(starts) - min(starts) if starts else None,
    )
    aborts = lost + [
        f"worker {job.worker}: {results[job.worker].aborted}"
        for job in jobs
        if job.worker in results and results[job.worker].aborted
    ]
    sources: dict[str, int] = {}
    for result in done:
        for source, count in result.answer_sources.items():
            sources[source] = sources.get(source, 0) + count
    return LoadResult(
        records=tuple(records),
        client=client,
        aborted="; ".join(aborts) or None,
        answer_sources=sources,
        replayed=tuple(finished),
        schedule_lags_ms=tuple(lag for result in done for lag in result.schedule_lags_ms),
        loop_lags_ms=tuple(lag for result in done for lag in result.loop_lags_ms),
        missed_arrivals=sum(result.missed_arrivals for result in done),
    )
