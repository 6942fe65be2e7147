"""The discrete-event simulator: a workload replayed against simulated nodes on a virtual clock.

The client side is the load generator's (`harness/loadgen.py`) on a virtual clock: both play the sessions with
the conversation driver (`measure/conversation.py`), which builds every prompt (carrying the previous answers
as token ids), the record and `reusable_tokens` under the simulated engine's isolation rule. Sessions start at
`session_offsets(load, ...)`; turn k+1 is queued when turn k is done plus its think time. Under a cap on requests
in flight (`load.cap`: a closed loop's concurrency, or an open loop's `max_concurrency`, vLLM's `--max-concurrency`
and inference-perf's `num_workers x worker_max_concurrency`) a due turn past the cap waits in the client, first
come first, until a request finishes: its record's `planned_ns` is when it was due, `queued_ns` and `sent_ns` when
it went, so TTFT counts from the send (as vLLM's benchmark and inference-perf count it) and TTFT from schedule
counts the wait. The server side is one or more `SimNode`s (the core's scheduler + a cost model). Records are
the harness's RequestRecords with virtual nanoseconds, so `summarize_run` and the reports apply unchanged.

Events, in virtual seconds, processed in (time, sequence) order so that runs are deterministic:

    TURN     a session's next turn is due: build the prompt, pick a node, plan its restore
    ARRIVE   the restore (if any) is done: the request joins the node's queue
    STEP     a node's step ends: postprocess, stream tokens, finish requests, start the next step (first
             running in one pass the pure decode steps that end before the next event, `SimNode.fast_forward`)
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.events import EventSink
from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.scheduler import (
    Request,
    RequestId,
)
from kvbench.measure.answer import Answer, Failure, FailureKind, Usage
from kvbench.measure.conversation import Conversation, ConversationDriver, ReuseOracle, placeholder_tokens
from kvbench.measure.record_builder import Asked, NextTurn, build_record
from kvbench.measure.records import ANSWER_TOKEN_IDS, RequestRecord
from kvbench.measure.schedule import MODE_CONCURRENCY, LoadSpec, session_offsets
from kvbench.sim.config import SimConfig
from kvbench.sim.fleet import build_nodes
from kvbench.sim.gc_pause import collector_paused
from kvbench.sim.node import SimNode
from kvbench.sim.pd import Handoff
from kvbench.sim.routing import Router
from kvbench.workloads.spec import Workload

NS = 1_000_000_000
TOO_LONG = Failure(FailureKind.TOO_LONG, "the prompt never fit in the device KV cache")
STREAMED = NextTurn(ANSWER_TOKEN_IDS, None)  # a simulated answer's ids are its placeholders, replayed, not kept
_TURN, _ARRIVE, _STEP = 0, 1, 2


@dataclass(frozen=True, slots=True)
class SimResult:
    records: tuple[RequestRecord, ...]
    device_pages: int
    nodes: tuple[dict, ...]  # per-node stats
    virtual_s: float
    wall_s: float
    node_of: Mapping[str, int] = field(default_factory=dict)  # request id -> the node it was routed to


@dataclass(slots=True)
class _Live:
    asked: Asked
    sent_ns: int
    session: int
    prompt: np.ndarray
    answer: np.ndarray
    node: int
    restored: dict[str, int]
    request: Request | None = None  # with a prefill/decode split: the client's, for the decode node
    prefill_cached: int | None = None  # ... and the prompt tokens the prefill node found cached
    first_token_ns: int | None = None
    chunks: list[list[int]] = field(default_factory=list)


@dataclass(slots=True)
class _Sim:
    config: SimConfig
    workload: Workload
    load: LoadSpec
    nodes: list[SimNode]
    driver: ConversationDriver
    talks: list[Conversation]  # one per session, by index
    seed: int = 0
    events: list = field(default_factory=list)
    seq: int = 0
    live: dict = field(default_factory=dict)
    records: list = field(default_factory=list)
    slots_free: int = 0  # under a cap (`load.cap`): requests that may still be sent now
    slot_waiters: deque = field(default_factory=deque)  # session indices due and waiting for a slot, first come first
    due: dict = field(default_factory=dict)  # session index -> when its waiting turn became due
    plans: dict = field(default_factory=dict)
    send_order: tuple[str, ...] | None = None  # replay: request ids in the order a real run sent them
    order_pos: int = 0
    parked: dict = field(default_factory=dict)  # request id -> session index: due, waiting for its turn in order
    router: Router | None = None
    pd: Handoff | None = None  # a prefill/decode split: the router picks among the prefill pool (`sim/pd.py`)
    node_of: dict = field(default_factory=dict)  # request id -> node
    # Open loop, one turn per session: another node's step can start nothing new (no next turn, no freed
    # slot), so a node's decode run needs to stop only at the next arrival (`arrivals`: the times of the
    # queued TURN and ARRIVE events), not at every node's step end. Routers then read a node's KV usage as of
    # the end of its run (pages its decodes will hold): the one thing that differs from stepping one by one.
    # Under a cap, a finish sends a waiting request: while any waits, every event may concern every node.
    nodes_independent: bool = False
    arrivals: list = field(default_factory=list)

    def push(self, t: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))
        if kind != _STEP:
            heapq.heappush(self.arrivals, (t, self.seq))

    def horizon(self) -> float:
        """When the next event that may concern a decoding node happens (see `nodes_independent`)."""
        if self.nodes_independent and not self.slot_waiters:
            return self.arrivals[0][0] if self.arrivals else math.inf
        return self.events[0][0] if self.events else math.inf

    # ---- client ------------------------------------------------------------------------------------------
    def in_order(self, rid: str, session_index: int) -> bool:
        """Replay: whether `rid` is the next request the real run sent; if not, park it until it is (or for
        good, when the real run sent no more)."""
        if self.send_order is None:
            return True
        if self.order_pos < len(self.send_order) and self.send_order[self.order_pos] == rid:
            return True
        self.parked[rid] = session_index
        return False

    def sent_in_order(self, now: float) -> None:
        if self.send_order is None:
            return
        self.order_pos += 1
        if self.order_pos < len(self.send_order) and self.send_order[self.order_pos] in self.parked:
            self.push(now, _TURN, self.parked.pop(self.send_order[self.order_pos]))

    def turn_due(self, now: float, session_index: int) -> None:
        talk = self.talks[session_index]
        rid = talk.next_request_id
        if not self.in_order(rid, session_index):
            return
        if self.load.cap is not None:
            if self.slots_free == 0:
                self.due.setdefault(session_index, now)
                self.slot_waiters.append(session_index)
                return
            self.slots_free -= 1
        due = self.due.pop(session_index, now)
        if not self.driver.may_send(now):
            self.release_slot(now)
            return
        self.sent_in_order(now)
        t_ns = int(round(now * NS))
        ask = talk.ask(t_ns, int(round(due * NS)))
        prompt, spec = ask.prompt, ask.spec
        answer = placeholder_tokens(talk.session.session_id, ask.turn, spec.max_tokens, self.workload.vocab_size)
        # shared_tokens stays 0 (the simulated cache shares no declared prefix across tenants, while the oracle
        # counts them as reusable): SimNode looks a prompt up below device in one namespace (namespace_for), not
        # in the core's Placement, so a prompt split across the shared and a tenant's namespace would miss there.
        request = Request(RequestId(rid), prompt, spec.max_tokens, tenant=TenantId(talk.session.tenant))
        node = self.router.pick(session_index, request, now)
        sent, sent_answer = request, answer
        if self.pd is not None:  # the prefill node is asked for the prompt and one token, not the client's
            sent, sent_answer = self.pd.prefill_request(request), answer[:1]
        self.node_of[rid] = node
        now += self.config.preset.router_latency_s
        restore = self.nodes[node].plan_restore(sent, now)
        self.live[rid] = _Live(
            ask.asked,
            t_ns,
            session_index,
            prompt,
            answer,
            node,
            {t.name.lower(): k for t, k in restore.tokens_by_tier.items()},
            request,
        )
        self.push(restore.ready_at, _ARRIVE, (node, sent, sent_answer, restore))

    def release_slot(self, now: float) -> None:
        if self.load.cap is None:
            return
        self.slots_free += 1
        if self.slot_waiters:
            self.push(now, _TURN, self.slot_waiters.popleft())

    def finish(self, live: _Live, now: float, cached: int, output: tuple[int, ...], reason: str) -> None:
        if self.pd is None or self.pd.is_prefill(live.node):
            self.router.finished(live.node, len(live.prompt))
        restored = self.nodes[live.node].restored.pop(live.asked.request_id, {})
        if live.prefill_cached is not None:  # the decode node's cache holds the handoff, not a hit
            cached, restored = live.prefill_cached, {}
        by_tier = live.restored | restored
        usage = Usage(
            int(live.prompt.size), len(output), cached, by_tier | {"device": max(cached - sum(by_tier.values()), 0)}
        )
        answer = Answer(
            sent_ns=live.sent_ns,
            http_status=200,
            first_token_ns=live.first_token_ns,
            done_ns=int(round(now * NS)),
            chunks=live.chunks,
            usage=usage,
            finish_reason=reason,
        )
        record = build_record(live.asked, answer, STREAMED)
        self.records.append(record)
        talk = self.talks[live.session]
        talk.answered(live.answer)
        self.release_slot(now)
        if not talk.finished:
            self.push(now + talk.think_time_s, _TURN, live.session)

    # ---- server ------------------------------------------------------------------------------------------
    def kick(self, node_index: int, now: float) -> None:
        node = self.nodes[node_index]
        if node.busy or not node.has_work():
            return
        # Steps that end before the next event (nothing else can happen meanwhile) may run in one pass.
        skipped = node.fast_forward(now, self.horizon())
        if skipped is not None:
            if skipped.ends:
                self.stream(skipped.request_ids, skipped.ends)
            plan, now, seconds = skipped.plan, skipped.begin, skipped.seconds
        else:
            started = node.begin_step(now)
            if started is None:  # nothing fits now; a finish, an arrival or a load done will kick again
                if node.wake_at is not None:
                    self.push(node.wake_at, _ARRIVE, (node_index, None, None, None))
                return
            plan, seconds = started
        self.push(now + seconds, _STEP, (node_index, plan))

    def stream(self, request_ids, ends: Sequence[float]) -> None:
        """Each of `request_ids` received one token at the end of each step that ended at `ends`.

        One chunk list per step, the same object in every record the step streamed to: a step of 200
        sequences made 200 equal lists, millions in a long run, and the collector walked them all. Records
        are never edited in place once made (`RequestRecord.shift_times` builds new chunks)."""
        times = [int(round(t * NS)) for t in ends]
        chunks = [[t, 1] for t in times]
        for rid in request_ids:
            live = self.live[rid]
            if live.first_token_ns is None:
                live.first_token_ns = times[0]
            live.chunks.extend(chunks)

    def step_done(self, node_index: int, plan, now: float) -> None:
        node = self.nodes[node_index]
        prefill = self.pd is not None and self.pd.is_prefill(node_index)
        if not prefill:  # a prefill node's token is not streamed: the decode node answers
            self.stream(plan.sampled_ids, (now,))
        for f in node.end_step(plan, now):
            if prefill:
                self.hand_off(node_index, self.live[f.request_id], f.num_cached_tokens, now)
            else:
                self.finish(self.live.pop(f.request_id), now, f.num_cached_tokens, f.output, f.finish_reason)
        self.kick(node_index, now)

    def hand_off(self, prefill_node: int, live: _Live, cached: int, now: float) -> None:
        """A prefill is done: its KV goes to a decode node, which runs the client's request once it is there."""
        self.router.finished(prefill_node, len(live.prompt))
        live.restored |= self.nodes[prefill_node].restored.pop(live.asked.request_id, {})
        live.prefill_cached = cached
        restore = self.pd.hand_off(prefill_node, live.request, now)
        live.node = self.pd.decode_node(self.nodes)
        self.push(restore.ready_at, _ARRIVE, (live.node, live.request, live.answer, restore))

    def run(self) -> None:
        sessions = self.workload.sessions
        offsets = session_offsets(self.load, [s.arrival_s for s in sessions], self.seed)
        self.play(sorted(range(len(sessions)), key=lambda i: offsets[i]), offsets)
        self.report_unfinished()

    def play(self, order: Sequence[int], offsets) -> None:
        """Start the sessions `order` (indices) at `offsets[index]` and run until nothing is left to happen."""
        for index in order:
            self.push(offsets[index], _TURN, index)
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if kind != _STEP:
                heapq.heappop(self.arrivals)  # the same event: both heaps order by (time, sequence)
            if kind == _TURN:
                self.turn_due(now, payload)
            elif kind == _ARRIVE:
                node_index, request, answer, restore = payload
                if request is not None:  # else a load done: the node may step again
                    self.nodes[node_index].admit(request, answer, restore, now)
                self.kick(node_index, now)
            else:
                self.step_done(payload[0], payload[1], now)

    def report_unfinished(self) -> None:
        for rid, live in sorted(self.live.items()):  # never fit: report as errors, not silently dropped
            answer = Answer(
                sent_ns=live.sent_ns, first_token_ns=live.first_token_ns, chunks=live.chunks, failure=TOO_LONG
            )
            self.records.append(build_record(live.asked, answer))
        self.live.clear()


def simulate(
    workload: Workload,
    load: LoadSpec,
    config: SimConfig,
    run_id: str = "sim",
    seed: int = 0,
    send_order: Sequence[str] | None = None,
    events: EventSink | None = None,
) -> SimResult:
    """Replay `workload` at `load` on the simulated system. Deterministic: same inputs, same records.

    `send_order` (request ids `session_id/turn`, e.g. a real run's records sorted by send time) makes the
    simulated client send requests in exactly that order, each when it is due and every earlier one has been
    sent, and nothing beyond it: timing then no longer decides which waiting session goes next, so a
    simulation of a real run makes the same cache decisions as the run did (at concurrency 1 exactly).
    `events` receives the cache events of every node's prefix index (stored, hit, evicted pages)."""
    started = time.perf_counter()
    sim = new_sim(workload, load, config, run_id, seed, send_order, events)
    with collector_paused():
        sim.run()
    return sim_result(sim, started)


def new_sim(
    workload: Workload,
    load: LoadSpec,
    config: SimConfig,
    run_id: str,
    seed: int,
    send_order: Sequence[str] | None = None,
    events: EventSink | None = None,
) -> _Sim:
    """A simulation ready to play: the nodes, the router and one conversation per session."""
    nodes = build_nodes(config, events)
    # Token ids only: a text prefix in the tenants file needs a tokenizer the simulator does not have, so it
    # is refused (in shared-prefix isolation) rather than silently never shared.
    oracle = ReuseOracle.following(config.isolation, config.tenants.shared_prefixes)
    driver = ConversationDriver(run_id, load, oracle)
    # A prefill's end (a step) sends work to a decode node: with a split, no node's run is independent.
    independent = (
        len(nodes) > 1
        and load.mode != MODE_CONCURRENCY
        and config.pd is None
        and all(len(s.turns) == 1 for s in workload.sessions)
    )
    pd = None if config.pd is None else Handoff(config.pd, config.preset.page_size, config.cost.kv_bytes_per_token)
    routed = nodes if pd is None else nodes[: config.pd.prefill_replicas]
    return _Sim(
        config,
        workload,
        load,
        nodes,
        driver,
        [driver.start(s) for s in workload.sessions],
        seed,
        slots_free=load.cap or 0,
        send_order=tuple(send_order) if send_order is not None else None,
        router=Router(
            routed,
            config.preset.route,
            config.preset.page_size,
            scorers=config.preset.scorers,
            rng=np.random.default_rng(seed),
            affinity=config.preset.affinity,
        ),
        nodes_independent=independent,
        pd=pd,
    )


def sim_result(sim: _Sim, started: float) -> SimResult:
    nodes = sim.nodes
    end = max((r.done_ns or 0 for r in sim.records), default=0) / NS
    stats = tuple(
        {
            "node": n.node_id,
            "steps": n.stats.steps,
            "fast_forwarded": n.stats.fast_forwarded,
            "busy_s": n.stats.busy_s,
            "preempted": n.stats.preempted,
            "restored_tokens": dict(n.stats.restored_tokens),
            "restored_bytes": {t: k * n.cost.kv_bytes_per_token for t, k in n.stats.restored_tokens.items()},
            "tier_hits": dict(n.stats.tier_hits),
            "load_wait_s": n.stats.load_wait_s,
            "restore_link_s": n.stats.restore_s,
        }
        for n in nodes
    )
    records = tuple(sorted(sim.records, key=lambda r: (r.queued_ns, r.request_id)))
    return SimResult(
        records, nodes[0].scheduler.index.pool.capacity, stats, end, time.perf_counter() - started, sim.node_of
    )
