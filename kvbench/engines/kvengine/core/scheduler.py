"""Scheduler: continuous batching with chunked prefill, prefix reuse at admission and preemption.

No clock inside: every call takes `now` from the caller, so the engine runs it in real time and the
simulator in virtual time. The model is not called here; a step is

    plan = scheduler.schedule(now)         # decides; pages are allocated, nothing is computed
    sampled = model(plan)                  # executor: swap_out copies first, then swap_in, then the model
    finished = scheduler.postprocess(plan, sampled, now)

The simulator takes the same decisions as CompactPlans (`schedule_compact`, `postprocess_compact`: no page
table per decode), and runs of steps certain to be pure decodes in one pass (`decode_run`,
`commit_decode_run`: the same pages, evictions and tokens as step by step); those live in `compact_steps`,
what the scheduler takes and returns in `plans`, and admission, preemption and the step here.

Token regions of a sequence (tokens = prompt + generated so far) in one step:

    | cached at admission | computed earlier | this step: [start, end) | not yet |
    0               num_cached_tokens                                       len(tokens)

A ScheduledSeq with `samples=True` ends at len(tokens): the model returns one sampled token for it. Its
`page_table` covers tokens [0, end) and stays valid until the next `schedule`. Pages are allocated per
chunk, asking first (`can_allocate`), then evicting cached pages (LRU, or the tenant ledger's order), then
preempting the most recently admitted running sequences. Computed full prompt pages enter the prefix index
after every step (locked by their sequence while it runs), so a request arriving meanwhile with the same
prefix reuses them; generated pages enter when the request finishes. A preempted sequence either
recomputes (its computed full pages go to the prefix index, so recompute is mostly prefix hits) or, with
`allow_swap`, is swapped to host: `StepPlan.swap_out` lists its device pages, which the executor must copy
before anything else in the step (they may be reused by this very plan); `swap_in` gives the new pages to
copy them back into. A sequence whose client reads nothing is parked (`parking`): no slot, no device page.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from kvbench.engines.kvengine.core.compact_steps import CompactSteps
from kvbench.engines.kvengine.core.events import EventKind
from kvbench.engines.kvengine.core.namespaces import Placement, TenantId, placement_for
from kvbench.engines.kvengine.core.parking import Parking
from kvbench.engines.kvengine.core.plans import (
    DEFAULT_TENANT,
    CompactPlan,
    DecodeRun,
    FinishedRequest,
    Request,
    RequestId,
    ScheduledSeq,
    SchedulerConfig,
    StepPlan,
    SwapIn,
    SwapOut,
)
from kvbench.engines.kvengine.core.prefix_index import DEVICE_TIER, PrefixIndex, PromptMatch
from kvbench.engines.kvengine.core.sequence import Sequence, check_holders
from kvbench.engines.kvengine.core.tenants import TenantLedger, evict_for

# What callers import from here: the scheduler, and what it takes and returns (defined in `plans`).
__all__ = [
    "DEFAULT_TENANT",
    "CompactPlan",
    "DecodeRun",
    "FinishedRequest",
    "Request",
    "RequestId",
    "ScheduledSeq",
    "Scheduler",
    "SchedulerConfig",
    "StepPlan",
    "SwapIn",
    "SwapOut",
]


@dataclass(slots=True)
class Scheduler(CompactSteps, Parking):
    index: PrefixIndex
    config: SchedulerConfig = SchedulerConfig()
    ledger: TenantLedger | None = None  # None: plain LRU eviction across tenants
    _waiting: deque = field(default_factory=deque)
    _running: list = field(default_factory=list)
    _seqs: dict = field(default_factory=dict)
    _parked: dict = field(default_factory=dict)  # request id -> Sequence set aside (`parking`)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every page's reference count is its number of holders: the prefix index
        (one per cached page) and each running sequence's own pages; a sequence's borrowed pages must be cached
        (the index holds their one reference), and no page of a running sequence may be evictable (eviction
        would free it, or leave it to two holders, under the sequence); a parked sequence holds none. Also checks
        the index and the pool."""
        check_holders(self.index, self._running, self._parked.values())

    def add(self, request: Request) -> None:
        if request.request_id in self._seqs:
            raise ValueError(f"request_id {request.request_id!r} is already scheduled; ids must be unique")
        need = self._pages_for(len(request.prompt) + request.max_new_tokens)
        if need > self.index.pool.capacity:
            # It could never be admitted and would wait forever: refuse it now.
            raise ValueError(
                f"request {request.request_id}: needs {need} pages, the pool holds "
                f"{self.index.pool.capacity}; shorten the prompt or max_new_tokens"
            )
        seq = Sequence(request, self.placement(request))
        self._seqs[request.request_id] = seq
        self._waiting.append(seq)

    def placement(self, request: Request) -> Placement:
        """Where the request's pages are cached (one namespace in strict isolation)."""
        return placement_for(
            request.tenant,
            request.prompt,
            shared_tokens=request.shared_tokens,
            page_size=self.index.page_size,
            strict=self.config.strict_isolation,
        )

    def _pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.index.page_size)

    def _usage(self) -> dict[TenantId, int]:
        """Device pages charged per tenant: its cached pages plus its running sequences' own pages."""
        usage = self.index.pages_by_tenant()
        for s in self._running:
            own = len(s.pages) - min(len(s.pages), s.match.num_pages if s.match else 0)
            usage[s.request.tenant] = usage.get(s.request.tenant, 0) + own
        return usage

    def can_allocate(self, n: int, tenant: TenantId, now: float) -> bool:
        """Whether `n` pages can be had, evicting cached pages if needed (evicts; never preempts)."""
        pool = self.index.pool
        if pool.can_allocate(n):
            return True
        short = n - pool.num_free
        if self.ledger is None:
            self.index.evict(short, now)
        else:
            evict_for(self.index, self.ledger, tenant, short, self._usage(), now)
        return pool.can_allocate(n)

    def allocate(self, seq: Sequence, n: int) -> None:
        seq.pages.extend(self.index.pool.allocate(n))

    def schedule(self, now: float) -> StepPlan:
        """Decide this step: running sequences first (decode or next prefill chunk), then admissions."""
        items, starts, preempted, swap_out, swap_in = self._schedule(now, compact=False)
        return StepPlan(now, tuple(items), tuple(preempted), tuple(swap_out), tuple(swap_in))

    def _schedule(self, now: float, compact: bool) -> tuple[list, list, list, list, list]:
        """Decodes first, then prefill chunks (running sequences' next chunks, in running order, then admissions).

        One step's budgets (vLLM's max_num_batched_tokens, decodes first, chunked prefill after):

            decodes   1 token per decoding sequence, up to max_step_tokens
            prefill   what max_step_tokens leaves, and at most max_prefill_beside_decodes while a decode runs

        so a long prompt is computed in small chunks beside running decodes instead of making them wait for its
        whole prefill; a step without decodes prefills up to max_step_tokens. A sequence that needs pages may
        preempt only sequences this step has not scheduled (never a decode already in the plan)."""
        config, running, ps = self.config, self._running, self.index.page_size
        budget = config.max_step_tokens
        items, starts, preempted, swap_out, swap_in = [], [], [], [], []  # plan entries, decode starts, ids, swaps
        scheduled, dropped, prefills = set(), set(), []  # sequences in the plan, preempted, to prefill after decodes
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            length = len(seq.request.prompt) + len(seq.output)  # seq.length, inlined: once per sequence per step
            if seq.num_computed + 1 != length or not seq.output:
                prefills.append(seq)  # scheduled after every decode
                i += 1
                continue
            need = -(-length // ps) - len(seq.pages)  # _pages_for, inlined
            # most decode steps stay inside their last page: nothing to allocate or preempt
            if need > 0 and not self._make_room(i, need, now, scheduled, dropped, preempted, swap_out):
                continue  # it was preempted itself
            scheduled.add(seq)
            if compact:  # the simulator's entry for a decode is the sequence itself (see CompactPlan)
                starts.append(seq.num_computed)
            items.append(seq if compact else self._item(seq, 1))
            budget -= 1
            i += 1
        if scheduled and config.max_prefill_beside_decodes is not None:
            budget = min(budget, config.max_prefill_beside_decodes)
        for seq in prefills:
            if budget <= 0:
                break
            if seq in dropped:
                continue
            n = min(len(seq.request.prompt) + len(seq.output) - seq.num_computed, budget)
            need = -(-(seq.num_computed + n) // ps) - len(seq.pages)
            if need > 0 and not self._make_room(running.index(seq), need, now, scheduled, dropped, preempted, swap_out):
                continue
            scheduled.add(seq)
            items.append(self._item(seq, n))
            budget -= n
        while self._waiting and budget > 0 and len(running) < config.max_num_seqs and not preempted:
            seq = self._waiting[0]
            if seq.swapped_pages:
                if not self.can_allocate(seq.swapped_pages, seq.request.tenant, now):
                    break
                self.allocate(seq, seq.swapped_pages)
                swap_in.append(SwapIn(seq.request.request_id, tuple(seq.pages)))
                seq.swapped_pages = 0
                running.append(self._waiting.popleft())
                continue  # resumes computing next step, after the copy
            if not self._admit(seq, budget, now, items):
                break
            budget -= items[-1].end - items[-1].start
            running.append(self._waiting.popleft())
        return items, starts, preempted, swap_out, swap_in

    def _make_room(
        self, i: int, need: int, now: float, scheduled: set, dropped: set, preempted: list, swap_out: list
    ) -> bool:
        """Allocate `need` pages to running[i], evicting cached pages, then preempting the latest admitted sequences
        after it that this step has not scheduled; if that is not enough, running[i] itself is preempted (False)."""
        running = self._running
        seq = running[i]
        while not self.can_allocate(need, seq.request.tenant, now):
            victim = next((j for j in range(len(running) - 1, i, -1) if running[j] not in scheduled), None)
            victim_seq = running.pop(i if victim is None else victim)
            dropped.add(victim_seq)
            self._preempt(victim_seq, now, preempted, swap_out)
            if victim is None:
                return False
        self.allocate(seq, need)
        return True

    def _admit(self, seq: Sequence, budget: int, now: float, items: list[ScheduledSeq]) -> bool:
        req, ps = seq.request, self.index.page_size
        tokens = seq.tokens()
        if self.config.prefix_caching and req.use_cached_prefix:
            match = self.index.match_prompt(seq.placement, tokens)
        else:
            match = PromptMatch()  # an empty match: nothing to lock, nothing reused
        cached_pages = min(match.num_pages, (len(tokens) - 1) // ps)  # always compute >= 1 token
        cached = cached_pages * ps
        n = min(len(tokens) - cached, budget)
        need = self._pages_for(cached + n) - cached_pages
        self.index.lock_prompt(match, now)  # before evicting, so the match survives
        if not self.can_allocate(need, req.tenant, now):
            self.index.unlock_prompt(match)
            return False
        seq.match = match
        seq.pages, seq._table, seq.borrowed = list(match.pages[:cached_pages]), None, cached_pages
        # The borrowed pages are in the index and locked through `match`. A recomputed sequence may borrow
        # pages past its prompt (its own generated pages, cached when it was preempted): `_index_computed`
        # must not move its lock to the shorter prompt path, or they would become evictable under it.
        seq.indexed_pages = cached_pages
        self.allocate(seq, need)
        seq.num_computed = cached
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = cached
        self.index.events.record(EventKind.HIT, req.tenant, DEVICE_TIER, cached_pages, now)
        items.append(self._item(seq, n))
        return True

    def _item(self, seq: Sequence, n: int) -> ScheduledSeq:
        end = seq.num_computed + n
        return ScheduledSeq(
            seq.request.request_id,
            seq.page_table(),
            seq.num_computed,
            end,
            seq.num_cached_tokens or 0,
            samples=end == seq.length,
        )

    def _index_computed(self, seq: Sequence, now: float) -> None:
        """Put the sequence's newly computed full prompt pages in the prefix index now, not only when it
        finishes, so that a request arriving meanwhile with the same prefix finds them (as vLLM and SGLang
        do); the sequence's lock moves to the longer path, so they stay unevictable while it runs. Generated
        pages wait for the finish: nobody else can share them sooner, and indexing every decode page as it
        fills doubled the cost of long simulations."""
        full = min(seq.num_computed, len(seq.request.prompt)) // self.index.page_size
        if full <= seq.indexed_pages or not self.config.prefix_caching:
            return
        req = seq.request
        tokens = req.prompt[: full * self.index.page_size]
        inserted = self.index.insert_prompt(
            seq.placement, tokens, seq.pages[:full], req.tenant, now, adopt_at=seq.borrowed
        )
        seq.borrowed += inserted.num_adopted
        match = PromptMatch(inserted.matches)
        self.index.lock_prompt(match, now)  # before the old lock goes: it keeps the adopted pages alive
        if seq.match is not None:
            self.index.unlock_prompt(seq.match)
        seq.match, seq.indexed_pages = match, full

    def _release(self, seq: Sequence, now: float, cache: bool) -> None:
        """Return a sequence's pages; with `cache`, its computed full pages go to the prefix index first."""
        req = seq.request
        if cache and seq.num_computed and self.config.prefix_caching:
            seq.borrowed += self.index.insert_prompt(
                seq.placement, seq.tokens()[: seq.num_computed], seq.pages, req.tenant, now, adopt_at=seq.borrowed
            ).num_adopted
        self.index.pool.release(seq.pages[seq.borrowed :] if seq.borrowed else seq.pages)
        if seq.match is not None:
            self.index.unlock_prompt(seq.match)
        seq.pages, seq.match, seq._table, seq.indexed_pages, seq.borrowed = [], None, None, 0, 0

    def _preempt(self, seq: Sequence, now: float, preempted: list, swap_out: list) -> None:
        preempted.append(seq.request.request_id)
        if self.config.allow_swap and seq.num_computed:
            swap_out.append(SwapOut(seq.request.request_id, tuple(seq.pages)))
            seq.swapped_pages = len(seq.pages)
            self._release(seq, now, cache=False)
        else:
            self._release(seq, now, cache=True)
            seq.num_computed = 0
        self._waiting.appendleft(seq)

    def finish(
        self, request_id: RequestId, now: float, reason: str = "abort", cache: bool = True
    ) -> FinishedRequest | None:
        """End a request now: a stop the caller found (a stop string), a client that went away, or a request
        whose computation failed (then `cache=False`: none of its pages not yet cached enters the index).

        Its computed pages are cached (with `cache`) and the rest released; None if the request is not (or no
        longer) here. Safe between steps, or for a request of a plan that will be postprocessed without it.
        """
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        if seq in self._running:
            self._running.remove(seq)
            self._release(seq, now, cache=cache)
        elif self._parked.pop(request_id, None) is None:
            self._waiting.remove(seq)  # a waiting sequence holds no device pages
        return FinishedRequest(
            request_id, len(seq.request.prompt), seq.num_cached_tokens or 0, tuple(seq.output), reason
        )

    def postprocess(self, plan: StepPlan, sampled: Mapping[RequestId, int], now: float) -> tuple[FinishedRequest, ...]:
        """Record that `plan` was computed; append `sampled[id]` for each sequence with `samples`.

        Finished requests cache their computed pages in the prefix index and release everything else."""
        finished: list[FinishedRequest] = []
        for item in plan.seqs:
            seq = self._seqs[item.request_id]
            seq.num_computed = item.end
            self._index_computed(seq, now)
            if not item.samples:
                continue
            if item.request_id not in sampled:
                raise ValueError(f"sampled: no token for request {item.request_id!r}, whose plan item samples")
            self._sampled(seq, int(sampled[item.request_id]), now, finished)
        return tuple(finished)

    def _sampled(self, seq: Sequence, tok: int, now: float, finished: list[FinishedRequest]) -> None:
        """Append a sampled token; a request that stops or reaches max_new_tokens finishes."""
        seq.output.append(tok)
        req = seq.request
        stop = tok in req.stop_token_ids
        if stop or seq.room <= 0:
            self._release(seq, now, cache=True)
            self._running.remove(seq)
            del self._seqs[req.request_id]
            finished.append(
                FinishedRequest(
                    req.request_id,
                    len(req.prompt),
                    seq.num_cached_tokens or 0,
                    tuple(seq.output),
                    "stop" if stop else "length",
                )
            )
