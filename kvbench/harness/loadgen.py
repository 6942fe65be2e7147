"""The load generator: replays a workload's sessions against one endpoint and records every request.

The conversations are played by the conversation driver (`kvbench.measure.conversation`), the same code the
simulator plays them with: this module is their wall clock and their HTTP transport. Sessions start on a
precomputed absolute schedule (or, closed loop, as slots free up). Turn k+1 of a session is queued when turn
k completes plus its think time, and its prompt carries turn k's real answer as token ids: from the server
when it returns them, else the answer text re-tokenized, else placeholder tokens of the reported length (each
record says which; `next_prompt`). Records are written and flushed as each request finishes.

A run that resumes an interrupted one is given the records it finished (`finished`): a turn with a finished
record is not sent again; its record and recorded answer are replayed into the conversation and the oracle,
so the turns sent after it carry the same prompts they would have carried without the interruption.

Requests that get no answer at all (connection errors, timeouts, stalls) `abort_after_unanswered` times in
a row mean the engine is gone or hung: the run stops sending, cancels what is in flight (those requests
get no record: nothing was measured) and says why in `LoadResult.aborted`.

The client checks itself (`kvbench.harness.client_check`, whose `ClientCheck` is re-exported here): schedule
lag (sent - queued) and event-loop lag are measured; a run whose lag is past the threshold is marked invalid,
because its TTFTs would include the client's own delays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from kvbench.distribution import Distribution
from kvbench.harness.client import (
    API_CHAT,
    EndpointConfig,
    chat_body,
    completions_body,
    stream_request,
)
from kvbench.harness.client_check import ClientCheck, check_lags, probe_loop
from kvbench.harness.clock import PreciseTimer
from kvbench.harness.next_prompt import ChatPrompt, TextCodec, answer_as_next_turn
from kvbench.harness.pacing import Gate, OpenGate, gate_for
from kvbench.measure import metrics
from kvbench.measure.answer import FailureKind
from kvbench.measure.conversation import (
    Conversation,
    ConversationDriver,
    Isolation,
    ReuseOracle,
    SharedPrefix,
)
from kvbench.measure.record_builder import build_record
from kvbench.measure.records import (
    RecordWriter,
    RequestRecord,
)
from kvbench.measure.schedule import LoadSpec, session_offsets
from kvbench.workloads.spec import Session, Workload

_PREOPENED_CONNECTIONS = 64
# Error kinds that mean the server did not answer at all (as opposed to answering with an error).
UNANSWERED_KINDS = (FailureKind.CONNECTION, FailureKind.TIMEOUT, FailureKind.STALLED)


@dataclass(frozen=True)
class LoadResult:
    """How the load generator ended. `aborted` names why it stopped early (e.g. the engine went away).

    `records` are the requests sent by this run; `replayed` the finished records of an interrupted run that it
    reused instead of sending them again (the point's records are both together).
    """

    records: tuple[RequestRecord, ...]
    client: ClientCheck
    aborted: str | None
    answer_sources: dict[str, int]
    replayed: tuple[RequestRecord, ...] = ()
    # The raw lags behind `client`, so that several workers' checks can be pooled.
    schedule_lags_ms: tuple[float, ...] = ()
    loop_lags_ms: tuple[float, ...] = ()
    # Request-rate points: arrivals that found no request ready (every session busy), so not sent.
    missed_arrivals: int = 0


@dataclass(slots=True)
class _RunState:
    """Everything one run's session tasks share."""

    t0_ns: int
    vocab_size: int
    driver: ConversationDriver
    writer: RecordWriter | None
    on_record: Callable[[RequestRecord], None] | None
    finished: Mapping[tuple[str, int], RequestRecord]  # (session, turn) -> record of the interrupted run
    timer: PreciseTimer = field(default_factory=PreciseTimer)
    gate: Gate = field(default_factory=OpenGate)  # when each request may go (pacing.py); set once t0 is known
    unanswered_in_a_row: int = 0
    aborted: str | None = None
    cancel: Callable[[], object] = lambda: None  # stops the sessions in flight; set once they start
    records: list[RequestRecord] = field(default_factory=list)
    replayed: list[RequestRecord] = field(default_factory=list)
    schedule_lag_ms: list[float] = field(default_factory=list)
    answer_sources: dict[str, int] = field(default_factory=dict)

    def abort(self, reason: str) -> None:
        if self.aborted is None:
            self.aborted = reason
            self.cancel()

    def may_send(self) -> bool:
        return self.aborted is None and self.driver.may_send((time.perf_counter_ns() - self.t0_ns) / 1e9)


@dataclass(frozen=True)
class LoadGenerator:
    """Replays one workload at one load point against one endpoint.

    `isolation` is the engine's rule for which earlier prompts it may reuse, which the oracle follows (see
    `Isolation`); `shared_prefixes` are the prefixes its tenants file declares shareable (read in
    `shared-prefix` isolation; a text needs `codec`). `abort_after_unanswered` requests in a row without an
    answer (connection error, timeout, stall) end the run early (the engine is gone or hung), keeping every
    finished record.
    """

    endpoint: EndpointConfig
    load: LoadSpec
    run_id: str
    seed: int = 0
    isolation: Isolation = Isolation.SHARED_ALL
    shared_prefixes: Sequence[SharedPrefix] = ()
    codec: TextCodec | None = None
    max_lag_ms: float = 10.0
    abort_after_unanswered: int = 3
    max_connections: int = 0  # 0: unlimited (aiohttp's default caps at 100, which would queue requests)
    tenant_api_keys: Mapping[str, str] = field(default_factory=dict)  # tenant -> key (multi-tenant engines)

    async def run(
        self,
        workload: Workload,
        writer: RecordWriter | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        finished: Sequence[RequestRecord] = (),
        offsets: Sequence[float] | None = None,
        start_at_s: float | None = None,
        oracle: ReuseOracle | None = None,
    ) -> LoadResult:
        """Play `workload`; `finished` are this point's records from an interrupted run, replayed, not sent.

        A load worker is given its sessions' start `offsets` (fixed by the driver for all workers) and the
        common start as a wall-clock epoch `start_at_s`; alone, the generator draws the offsets itself (a
        stage is given its own) and starts once its connections are open. `oracle` continues what an earlier
        play on the same cache observed (a later load stage); None starts a new one (`new_oracle`)."""
        if self.endpoint.api == API_CHAT and self.codec is None:
            raise ValueError("api=chat needs a tokenizer to turn the workload's token ids into text: give --tokenizer")
        oracle = oracle if oracle is not None else self.new_oracle()
        if offsets is None:
            offsets = session_offsets(self.load, [session.arrival_s for session in workload.sessions], self.seed)
        state = _RunState(
            t0_ns=0,  # set once connections are open
            vocab_size=workload.vocab_size,
            driver=ConversationDriver(self.run_id, self.load, oracle),
            writer=writer,
            on_record=on_record,
            finished={(record.session_id, record.turn): record for record in finished},
        )
        loop_lags: list[float] = []
        connector = aiohttp.TCPConnector(limit=self.max_connections, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            await self._open_connections(http, len(workload.sessions))
            start_offset_ms = None
            if start_at_s is None:
                # A few ms to set everything up before the first arrival.
                state.t0_ns = time.perf_counter_ns() + 5_000_000
            else:
                state.t0_ns = time.perf_counter_ns() + int((start_at_s - time.time()) * 1e9)
                await state.timer.sleep_until(state.t0_ns)
                start_offset_ms = (time.time() - start_at_s) * 1e3
            state.gate = gate_for(self.load, self.seed, state.t0_ns, state.timer, state.may_send)
            probe = asyncio.create_task(probe_loop(loop_lags))
            try:
                await self._play(http, workload, list(offsets), state)
            finally:
                probe.cancel()
                state.timer.close()
        check = self.check(state.schedule_lag_ms, loop_lags, state.records)
        return LoadResult(
            records=tuple(state.records),
            client=dataclasses.replace(check, start_offset_ms=start_offset_ms),
            aborted=state.aborted,
            answer_sources=dict(state.answer_sources),
            replayed=tuple(state.replayed),
            schedule_lags_ms=tuple(state.schedule_lag_ms),
            loop_lags_ms=tuple(loop_lags),
            missed_arrivals=state.gate.missed,
        )

    def new_oracle(self) -> ReuseOracle:
        """An oracle that has observed nothing, under this engine's isolation rule."""
        return ReuseOracle.following(self.isolation, self.shared_prefixes, self.codec.encode if self.codec else None)

    async def _play(
        self, http: aiohttp.ClientSession, workload: Workload, offsets: list[float], state: _RunState
    ) -> None:
        """Start every session on its schedule and wait for all; an abort cancels them (and ends this quietly)."""
        arrivals = asyncio.create_task(self._arrivals(http, workload, offsets, state))
        state.cancel = arrivals.cancel
        try:
            await arrivals
        except asyncio.CancelledError:
            if state.aborted is None:
                raise  # cancelled from outside (Ctrl-C): not ours to swallow

    async def _arrivals(
        self, http: aiohttp.ClientSession, workload: Workload, offsets: list[float], state: _RunState
    ) -> None:
        order = sorted(range(len(workload.sessions)), key=lambda index: offsets[index])
        tasks: list[asyncio.Task] = []
        try:
            for index in order:
                start_ns = state.t0_ns + int(offsets[index] * 1e9)
                await state.timer.sleep_until(start_ns)
                if not state.may_send():
                    break
                tasks.append(asyncio.create_task(self._session(http, workload.sessions[index], start_ns, state)))
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            state.gate.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _session(self, http: aiohttp.ClientSession, session: Session, start_ns: int, state: _RunState) -> None:
        endpoint = self.endpoint
        if session.tenant in self.tenant_api_keys:
            endpoint = dataclasses.replace(endpoint, api_key=self.tenant_api_keys[session.tenant])
        talk = state.driver.start(session)
        chat = ChatPrompt(self.codec, session) if self.endpoint.api == API_CHAT and self.codec is not None else None
        queued_ns = start_ns
        while not talk.finished:
            previous = state.finished.get((session.session_id, talk.turn))
            if previous is not None:
                record = self._replay(previous, talk, chat, state)
                queued_ns = time.perf_counter_ns()
            else:
                if talk.turn:
                    queued_ns += int(talk.think_time_s * 1e9)
                    await state.timer.sleep_until(queued_ns)
                record = await self._send(http, endpoint, talk, chat, queued_ns, state)
                queued_ns = (record.done_ns if record else None) or time.perf_counter_ns()
            if record is None or not record.ok:
                return  # the run is over, or a failed turn ended its session (the next prompt would not be real)

    def _replay(
        self, record: RequestRecord, talk: Conversation, chat: ChatPrompt | None, state: _RunState
    ) -> RequestRecord | None:
        """Take a finished turn of the interrupted run as if it had just been answered again."""
        if not state.may_send():
            return None
        if chat is not None:
            chat.asked(talk.turn)
            if record.ok:
                chat.answered(record.answer_text or "")
        talk.replay(record)
        state.replayed.append(record)
        return record

    async def _send(
        self,
        http: aiohttp.ClientSession,
        endpoint: EndpointConfig,
        talk: Conversation,
        chat: ChatPrompt | None,
        queued_ns: int,
        state: _RunState,
    ) -> RequestRecord | None:
        """Send one turn once its gate lets it (a request arrival, a free slot under a cap); None when the run
        may send no more."""
        admission = await state.gate.enter(queued_ns, first_turn=talk.turn == 0)
        if admission is None:
            return None
        # planned: when the schedule meant it to go, whatever waits follow; queued: when the gate let it go.
        planned_ns, queued_ns = admission.planned_ns, admission.queued_ns
        try:
            if not state.may_send():
                return None
            ask = talk.ask(queued_ns, planned_ns)
            if chat is not None:
                chat.asked(ask.turn)
                body = chat_body(endpoint, chat.messages, ask.spec.max_tokens)
            else:
                body = completions_body(endpoint, ask.prompt.tolist(), ask.spec.max_tokens)
            answer = await stream_request(http, endpoint, body)
        finally:
            state.gate.leave()
        state.schedule_lag_ms.append((answer.sent_ns - queued_ns) / 1e6 if answer.sent_ns else 0.0)
        next_turn = None
        if answer.failure is None:
            next_turn = answer_as_next_turn(answer, ask, self.codec, state.vocab_size, chat is not None)
            talk.answered(np.asarray(next_turn.tokens, dtype=np.int32))
            if chat is not None:
                chat.answered(answer.text)
        record = build_record(ask.asked, answer, next_turn)
        self._finish(record, state)
        return record

    async def _open_connections(self, http: aiohttp.ClientSession, sessions: int) -> None:
        """Open keep-alive connections before the clock starts, so early TTFTs do not include TCP set-up.

        Best effort: a server without /v1/models, or one that is down, is found out by the real requests.
        """
        count = min(self.load.cap or sessions, _PREOPENED_CONNECTIONS)
        url = self.endpoint.base_url.rstrip("/") + "/v1/models"

        async def touch() -> None:
            try:
                async with http.get(
                    url, headers=self.endpoint.headers(), timeout=aiohttp.ClientTimeout(total=5)
                ) as reply:
                    await reply.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass

        await asyncio.gather(*(touch() for _ in range(count)))

    def _finish(self, record: RequestRecord, state: _RunState) -> None:
        state.records.append(record)
        if state.writer is not None:
            state.writer.write(record)
        if state.on_record is not None:
            state.on_record(record)
        if record.ok:
            state.answer_sources[record.answer_source] = state.answer_sources.get(record.answer_source, 0) + 1
            state.unanswered_in_a_row = 0
        elif record.error_kind in UNANSWERED_KINDS:
            state.unanswered_in_a_row += 1
            if state.unanswered_in_a_row >= self.abort_after_unanswered:
                state.abort(
                    f"engine unreachable: {state.unanswered_in_a_row} requests in a row got no answer "
                    f"(last: {record.error})"
                )

    def check(
        self, schedule_lags: Sequence[float], loop_lags: Sequence[float], records: Sequence[RequestRecord]
    ) -> ClientCheck:
        """The self-check of these lags (ms) against a bound relative to the records' TTFT (see `client_check`)."""
        ttft = Distribution.of(metrics.ttft_values(records))
        return check_lags(schedule_lags, loop_lags, self.max_lag_ms, self.load.mode, ttft.p50 if ttft else None)
