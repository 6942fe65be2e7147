"""One simulated serving node: the core's scheduler driven like the engine's step loop, timed by a cost model.

This is the only module that drives the KV core; it mirrors the engine runtime's loop

    plan = scheduler.schedule_compact(now)            # begin_step (schedule(now) without page tables)
    seconds = cost(plan)                              #   (the real engine runs the model here)
    finished = scheduler.postprocess_compact(plan, sampled, now + seconds)   # end_step

so `sim/validate.py` can compare the two. Around it, the tiers below device (`below`: LMCache-style
write-through copies, or our engine's TTL tier policy) are driven at the engine's fixed points: on arrival
the prompt is looked up below and the part the device lacks is restored (pipelined, on the node's one
restore link, in FIFO order); before each step the tiers keep their placement; after anything that may evict,
dropped pages go down; on completion computed pages may be written through. "Sampling" returns the
workload's planned answer tokens, so the next turn's prompt is exact.

Between events most steps decode the same running set: `fast_forward` runs those (the ones certain to be pure
decodes, up to the next event) in one pass, `scheduler.decode_run` then `commit_decode_run`, with what the
loop above would have done step by step (`SimConfig.decode_runs=False` steps one by one, for comparison).
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.adoption import adopt_pages
from kvbench.engines.kvengine.core.namespaces import Placement, namespace_for
from kvbench.engines.kvengine.core.scheduler import (
    CompactPlan,
    DecodeRun,
    FinishedRequest,
    Request,
    Scheduler,
)
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.cost import CostModel
from kvbench.sim.hybrid_cache import StaleSliding
from kvbench.sim.lower_tiers import BelowDevice, Lookup, WriteThroughTiers
from kvbench.sim.node_records import DecodeSteps, NodeStats, Restore
from kvbench.sim.presets import ADMIT_LPM

ADMIT_WINDOW = 8  # requests waiting in the scheduler's own FIFO at most (see `_feed`)


@dataclass(slots=True)
class SimNode:
    node_id: int
    scheduler: Scheduler
    cost: CostModel
    below: BelowDevice = field(default_factory=WriteThroughTiers)  # default: device only
    admission: str = "fcfs"
    decode_runs: bool = True  # False: every step goes through schedule/postprocess (the records are the same)
    stats: NodeStats = field(default_factory=NodeStats)
    busy: bool = False
    _pending: list = field(default_factory=list)
    _live: dict = field(default_factory=dict)  # request id -> (Request, answer tokens to sample, as a list)
    _produced: dict = field(default_factory=dict)
    _link_free_at: float = 0.0
    _loading: list = field(default_factory=list)  # heap of (ready at, seq, request, restore): loads in flight
    _retrieve_s: dict = field(default_factory=dict)  # request id -> its load in the forward pass that schedules it
    restored: dict = field(default_factory=dict)  # request id -> {tier name: tokens} restored at admission
    _resumed: dict = field(default_factory=dict)  # request id -> FinishedRequest-so-far and client's Request
    _blocked: bool = False  # the last `_feed` stopped at a load the device had no room for (pure decodes free none)
    _prefilling: set = field(default_factory=set)  # requests whose prompt is partly computed
    _held: dict = field(default_factory=dict)  # request id -> its loaded prefix, locked until it is scheduled
    stale: StaleSliding | None = None  # a hybrid model's stale sliding-window pages (sim/hybrid_cache.py)

    @property
    def page_size(self) -> int:
        return self.scheduler.index.page_size

    @property
    def load(self) -> int:
        return len(self._live)

    @property
    def waiting(self) -> int:
        """Requests queued and not yet running (vLLM's `num_requests_waiting`, what llm-d's queue scorer reads)."""
        return len(self._pending) + self.scheduler.num_waiting

    @property
    def kv_usage(self) -> float:
        """The share of device pages held by requests (vLLM's `kv_cache_usage_perc`: cached pages no request
        holds count as free, as vLLM's free queue counts them)."""
        index = self.scheduler.index
        return (index.pool.num_used - index.evictable_pages) / max(index.pool.capacity, 1)

    def _namespace(self, request: Request):
        return namespace_for(request.tenant, shareable=request.shareable, strict=self.scheduler.config.strict_isolation)

    def cached_pages(self, request: Request) -> int:
        """Leading prompt pages this node's device cache holds now (what a cache-aware router asks)."""
        return self.scheduler.index.match_prompt(self.scheduler.placement(request), request.prompt).num_pages

    def offloaded_pages(self, request: Request, now: float) -> int:
        """Leading prompt pages this node's own tiers below device hold at `now` (what llm-d's CPU prefix
        scorer reads from vLLM's KV events with medium CPU); a peer's cache is not this node's."""
        return self.below.held_pages(self._namespace(request), request.prompt, now)

    # ---- arrival -----------------------------------------------------------------------------------------
    def plan_restore(self, request: Request, now: float) -> Restore:
        """What the tiers below add beyond the device's cached prefix, and when it can be on the device (at
        arrival; nothing when the tiers are looked up at admission, `_admit_restore`)."""
        if self.below.restores_at_admission:
            return Restore(None, now)
        return self._restore(request, now)

    def _lookup(self, request: Request, now: float) -> Lookup | None:
        limit = (len(request.prompt) - 1) // self.page_size  # the scheduler always computes the last token
        return self.below.lookup(self.scheduler.index, self._namespace(request), request.prompt, limit, now)

    def _restore(self, request: Request, now: float, lookup: Lookup | None = None) -> Restore:
        lookup = self._lookup(request, now) if lookup is None else lookup
        if lookup is None:
            return Restore(None, now)
        start = max(now, self._link_free_at)
        self._link_free_at = start + self.cost.restore_seconds(lookup.tokens_by_tier)
        self.stats.restore_s += self._link_free_at - start
        return Restore(lookup, self._link_free_at)

    def admit(self, request: Request, answer: np.ndarray, restore: Restore, now: float) -> None:
        """Queue a request whose restore is done (`answer`: the tokens it will sample)."""
        self._live[request.request_id] = (request, np.asarray(answer).tolist())  # ints: one read per decode step
        self._produced[request.request_id] = 0
        self._pending.append((request, restore))

    @property
    def wake_at(self) -> float | None:
        """When the next load in flight is done (None: none): the node has work then even if idle now."""
        return self._loading[0][0] if self._loading else None

    def _admit_restore(self, request: Request, restore: Restore, now: float) -> bool | None:
        """At admission (the tiers are looked up now): False when the request waits for an asynchronous load
        (it joins the scheduler when the load is done, `_land_loads`); else its restore is installed, and the
        next step waits for a load in its forward pass. None: the device cannot take the load's blocks now
        (vLLM allocates them before it loads, `allocate_slots`): nothing is loaded, the request waits."""
        if self.below.restores_at_admission and restore.lookup is None:  # else a handoff's (sim/pd.py)
            lookup = self._lookup(request, now)
            if lookup is not None and not self._room_for(request, lookup, now):
                self._blocked = True  # only a finish frees pages: pure decodes may run on meanwhile
                return None
            if lookup is not None and not self.below.async_load:
                if self.scheduler.num_waiting or self._prefilling:
                    # LMCache retrieves in the step that schedules it: fed at the queue's head when no prefill
                    # chunk takes the step's budget, so that the next step schedules it
                    return None
                # Paid by the step that schedules it (`_retrieve_s`), one retrieve after the other: the
                # link is that step's, so no queue on it carries over from the steps before.
                seconds = self.cost.restore_seconds(lookup.tokens_by_tier)
                self.stats.restore_s += seconds
                self._retrieve_s[request.request_id] = seconds
                restore = Restore(lookup, now + seconds)
            else:
                restore = self._restore(request, now, lookup)
            if restore.lookup is not None and self.below.async_load:
                heapq.heappush(self._loading, (restore.ready_at, request.request_id, request, restore))
                return False
        if restore.lookup is not None:
            self._install(request, restore.lookup, now)
        return True

    def _land_loads(self, now: float) -> None:
        """Requests whose asynchronous load is done join the scheduler, their pages installed."""
        while self._loading and self._loading[0][0] <= now:
            _, _, request, restore = heapq.heappop(self._loading)
            self._install(request, restore.lookup, now)
            self._add(request)

    def _install(self, request: Request, lookup: Lookup, now: float) -> None:
        """The restored pages become device pages, as the engine adopts them (`adopt_pages`)."""
        by_tier = self.restored.setdefault(request.request_id, {})
        for tier, k in lookup.tokens_by_tier.items():
            name = tier.name.lower()
            self.stats.restored_tokens[name] = self.stats.restored_tokens.get(name, 0) + k
            self.stats.tier_hits[name] = self.stats.tier_hits.get(name, 0) + 1
            by_tier[name] = by_tier.get(name, 0) + k
        placement = Placement(self._namespace(request))
        ps = self.page_size
        device_pages = self.scheduler.index.match_prompt(placement, request.prompt[: lookup.pages * ps]).num_pages
        pages = self.below.install_upto(lookup, device_pages)
        if pages <= device_pages:
            return
        if adopt_pages(self.scheduler, placement, request.prompt[: pages * ps], request.tenant, now).pages:
            self.below.installed(lookup, device_pages)
        # The loaded blocks are the request's until it is scheduled (vLLM's are allocated to it): held here,
        # so that requests queued ahead cannot evict what was paid for (`_release`).
        self._release(request.request_id)
        held = self.scheduler.index.match_prompt(placement, request.prompt[: pages * ps])
        self.scheduler.index.lock_prompt(held, now)
        self._held[request.request_id] = held

    def _room_for(self, request: Request, lookup: Lookup, now: float) -> bool:
        """Whether the device can take the pages a load brings (always, when nothing else runs or waits)."""
        if self.scheduler.num_running == 0 and self.scheduler.num_waiting == 0 and not self._loading:
            return True
        return self.scheduler.can_allocate(lookup.pages - lookup.start, request.tenant, now)

    def _release(self, request_id: str) -> None:
        held = self._held.pop(request_id, None)
        if held is not None:
            self.scheduler.index.unlock_prompt(held)

    # ---- the step loop -----------------------------------------------------------------------------------
    def _feed(self, now: float) -> None:
        """Hand pending requests to the scheduler's FIFO, a few at a time (first come first, or longest cached
        prefix first), installing each one's restored pages into the device cache as it is handed over.

        Why a window: the core has no admission hook, so restored pages wait in the device cache as ordinary
        evictable pages; installing them just before the scheduler can admit keeps them from being evicted
        by the requests queued ahead."""
        index = self.scheduler.index
        self._blocked = False
        while self._pending and self._queued < ADMIT_WINDOW:
            pick = 0
            if self.admission == ADMIT_LPM:
                pick = max(
                    range(len(self._pending)),
                    key=lambda i: (
                        index.match(self._namespace(self._pending[i][0]), self._pending[i][0].prompt).num_pages
                    ),
                )
            if self._pending[pick][0].request_id in self._resumed and not self._may_resume(self._pending[pick][0]):
                return
            request, restore = self._pending.pop(pick)
            admitted = self._admit_restore(request, restore, now)
            if admitted is None:  # its load waits (room, or a prefill ahead): it stays first, none overtakes
                self._pending.insert(pick, (request, restore))
                return
            if admitted:
                self._add(request)

    def _may_resume(self, request: Request) -> bool:
        """Whether a preempted request may be fed again (and its tiers looked up) now: when nothing runs, or
        the pool's free pages hold what the device lacks of it; as vLLM retries it only when its blocks can
        be allocated, by which time the device may have evicted what it had."""
        if self.scheduler.num_running == 0:
            return True
        index = self.scheduler.index
        lacks = (
            -(-len(request.prompt) // self.page_size) - index.match(self._namespace(request), request.prompt).num_pages
        )
        return lacks <= index.pool.num_free

    def _add(self, request: Request) -> None:
        try:
            self.scheduler.add(request)
        except ValueError:
            # It can never fit in this node's device KV: it stays unfinished, and the simulator reports every
            # unfinished request as an error when the run ends.
            self._release(request.request_id)
            self._retrieve_s.pop(request.request_id, None)

    @property
    def _queued(self) -> int:
        """Requests handed over and not yet running: in the scheduler's FIFO, or loading to join it (a load is
        looked up near the head of the queue, as vLLM looks it up, and its pages are not held meanwhile)."""
        return self.scheduler.num_waiting + len(self._loading)

    def has_work(self) -> bool:
        return bool(self._pending) or bool(self._loading) or self.scheduler.has_work()

    def begin_step(self, now: float) -> tuple[CompactPlan, float] | None:
        """Schedule one step at `now`; returns the plan and its duration, or None when nothing can run."""
        self.below.maintain(self.scheduler.index, now)
        self._land_loads(now)
        self._feed(now)
        plan = self.scheduler.schedule_compact(now)  # what schedule(now) decides, without a page table per decode
        if not plan.entries and self._held and self.scheduler.num_running == 0:
            for rid in list(self._held):  # the loaded prefixes would keep the queue's head out: let them go
                self._release(rid)
            plan = self.scheduler.schedule_compact(now)
        stall = 0.0
        for e in plan.others if self._held or self._retrieve_s else ():  # scheduled: it holds its own pages
            self._release(e.request_id)
            stall += self._retrieve_s.pop(e.request_id, 0.0)
        self.below.sync(now)  # pages evicted by the installs and the schedule
        if plan.preempted and self.below.restores_at_admission:
            self._requeue(plan.preempted, now)
        if not plan.entries and not plan.swap_in and not plan.swap_out:
            return None
        seconds = self.cost.step(plan.others, plan.decode_starts).seconds + stall
        self.stats.load_wait_s += stall
        swapped = sum(len(s.pages) for s in plan.swap_out) + sum(len(s.pages) for s in plan.swap_in)
        if swapped:
            seconds += self.cost.transfer_seconds(Tier.HOST, swapped * self.page_size)
        self.stats.steps += 1
        self.stats.busy_s += seconds
        self.stats.preempted += len(plan.preempted)
        self.busy = True
        return plan, seconds

    def _requeue(self, preempted, now: float) -> None:
        """Preempted requests go back to the head of the queue as requests for what they still have to
        generate, their prompt extended by what they generated: when they are fed to the scheduler again, the
        tiers are looked up for them as for any request (vLLM: a preempted request waits again, and
        `get_num_new_matched_tokens` loads what its offloaded blocks hold instead of recomputing them)."""
        for rid in reversed(preempted):
            self._release(rid)
            self._prefilling.discard(rid)
            part = self.scheduler.finish(rid, now, reason="preempted")
            first, client = self._resumed.get(rid, (None, self._live[rid][0]))
            output = (first.output if first else ()) + part.output
            first = part if first is None else dataclasses.replace(first, output=output)
            self._resumed[rid] = (first, client)
            again = dataclasses.replace(
                client,
                prompt=np.concatenate([client.prompt, np.asarray(output, np.int32)]),
                max_new_tokens=client.max_new_tokens - len(output),
            )
            self._live[rid] = (again, self._live[rid][1])
            # Its decode blocks were stored as they filled (vLLM stores every computed block; the simulated
            # tiers take them at the finish, or here): all but the last token sampled have KV.
            self.below.computed(rid, self._namespace(again), again.prompt, len(again.prompt) - 1, again.tenant, now)
            self._pending.insert(0, (again, Restore(None, now)))

    def fast_forward(self, now: float, horizon: float) -> DecodeSteps | None:
        """Instead of `begin_step(now)`: take, in one pass, the steps from `now` that are certain to be pure
        decodes (`Scheduler.decode_run`) and end before `horizon` (when anything else happens: an arrival,
        another node's step), and begin the next one, whose plan `end_step` commits at its end as any other.
        Each step is timed from three numbers instead of a plan; what `begin_step` and `end_step` one step at a
        time would do, to the bit. None when no step is certain (then `begin_step`). The tiers below must be
        passive (nothing to do at a step's fixed points)."""
        if (
            not self.decode_runs
            or not self.below.passive
            or (self._pending and self._queued < ADMIT_WINDOW and not self._blocked)  # else `_feed` would admit
            or (self._loading and self._loading[0][0] <= now)
        ):  # ... or a load done would join
            return None
        run = self.scheduler.decode_run()
        if run is None:
            return None
        if self._loading:  # a load done meanwhile joins at the next step's start
            horizon = min(horizon, self._loading[0][0])
        begins, seconds = self._time_run(run, now, horizon)
        k, live, produced = len(begins), self._live, self._produced
        tokens = []
        for rid in run.request_ids:
            p = produced[rid]
            tokens.append(live[rid][1][p : p + k - 1])
            produced[rid] = p + k - 1
        plan = self.scheduler.commit_decode_run(run, begins, tokens)
        self.stats.steps += k
        self.stats.fast_forwarded += k
        self.busy = True
        return DecodeSteps(run.request_ids, tuple(begins[1:]), plan, begins[-1], seconds)

    def _time_run(self, run: DecodeRun, now: float, horizon: float) -> tuple[list[float], float]:
        """When the run's steps begin, one after the other from `now`, while the one before ended before
        `horizon`, and the last one's seconds; every step's seconds are added to busy time in order, as
        `begin_step` adds them."""
        stats, begins = self.stats, []
        for seconds in self.cost.decode_seconds(len(run.request_ids), run.starts_sum, run.longest_start, run.steps):
            begins.append(now)
            stats.busy_s += seconds
            now += seconds
            if now >= horizon:
                break
        return begins, seconds

    def end_step(self, plan: CompactPlan, now: float) -> tuple[FinishedRequest, ...]:
        """Commit `plan` at `now` (its end); write finished requests through to the lower tiers."""
        live, produced = self._live, self._produced
        tokens = []
        for rid in plan.sampled_ids:
            k = produced[rid]
            tokens.append(live[rid][1][k])
            produced[rid] = k + 1
        finished = self.scheduler.postprocess_compact(plan, tokens, now)
        self.busy = False
        for e in plan.others:  # prefill chunks: their computed blocks may be stored now
            request = live[e.request_id][0]
            done = min(e.end, len(request.prompt))
            if done < len(request.prompt):
                self._prefilling.add(e.request_id)
            else:
                self._prefilling.discard(e.request_id)
            self.below.computed(e.request_id, self._namespace(request), request.prompt, done, request.tenant, now)
            if self.stale is not None:  # a hybrid model's sliding-window pages left behind by this chunk
                self.stale.cache(self.scheduler, request.tenant, self.stale.left_window(e.start, done), now)
        return tuple(self._finished(f, now) for f in finished)

    def _finished(self, f: FinishedRequest, now: float) -> FinishedRequest:
        """A request done: written through to the lower tiers; a requeued one (`_requeue`) as the client's
        request, with its prompt, its first admission's hit and its whole output."""
        request, _ = self._live.pop(f.request_id)
        self._release(f.request_id)
        del self._produced[f.request_id]
        if f.request_id in self._resumed:
            first, request = self._resumed.pop(f.request_id)
            f = dataclasses.replace(first, output=first.output + f.output, finish_reason=f.finish_reason)
        self.below.store(f.request_id, self._namespace(request), request.prompt, f.output, request.tenant, now)
        return f
