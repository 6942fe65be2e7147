"""Scheduler: continuous batching with chunked prefill, prefix reuse at admission and preemption.

No clock inside: every call takes `now` from the caller, so the engine runs it in real time and the
simulator in virtual time. The model is not called here; a step is

    plan = scheduler.schedule(now)         # decides; pages are allocated, nothing is computed
    sampled = model(plan)                  # executor: swap_out copies first, then swap_in, then the model
    finished = scheduler.postprocess(plan, sampled, now)

The simulator takes the same decisions as CompactPlans (`schedule_compact`, `postprocess_compact`: no page
table per decode), and runs of steps certain to be pure decodes in one pass (`decode_run`,
`commit_decode_run`: the same pages, evictions and tokens as step by step).

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
copy them back into.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, NewType, Sequence

import numpy as np

from kvbench.engines.kvengine.core.events import EventKind
from kvbench.engines.kvengine.core.pages import IntegrityError, PageId
from kvbench.engines.kvengine.core.namespaces import Placement, TenantId, placement_for
from kvbench.engines.kvengine.core.prefix_index import DEVICE_TIER, PrefixIndex, PromptMatch
from kvbench.engines.kvengine.core.tenants import TenantLedger, evict_for

RequestId = NewType("RequestId", str)
DEFAULT_TENANT = TenantId("default")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_step_tokens: int = 2048  # prefill chunk tokens + decode tokens per step
    allow_swap: bool = False  # preempt by swapping to host instead of recomputing
    strict_isolation: bool = True  # False: a request's declared-shareable prefix is cached in the shared namespace
    prefix_caching: bool = True  # False: never look up or insert cached pages (every prompt recomputed)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_step_tokens < 1:
            raise ValueError("SchedulerConfig: max_num_seqs and max_step_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class Request:
    request_id: RequestId
    prompt: np.ndarray  # 1-D token ids
    max_new_tokens: int
    tenant: TenantId = DEFAULT_TENANT
    # Leading prompt tokens declared shareable across tenants (outside strict isolation; see placement_for)
    shared_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    # False: compute the whole prompt even if it is cached (e.g. prompt logprobs need every position's logits)
    use_cached_prefix: bool = True

    def __post_init__(self) -> None:
        if np.ndim(self.prompt) != 1 or len(self.prompt) == 0:
            raise ValueError(f"request {self.request_id}: prompt must be a non-empty 1-D array of token ids")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_new_tokens must be >= 1")

    @property
    def shareable(self) -> bool:
        """Whether the whole prompt is declared shareable, so that one namespace holds all of it (what a
        caller that looks a prompt up in one namespace, like the simulator's tiers, may rely on)."""
        return self.shared_tokens >= len(self.prompt)


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    request_id: RequestId
    page_table: tuple[PageId, ...]
    start: int  # first token position computed this step
    end: int  # one past the last
    num_cached_tokens: int  # prompt tokens found in the cache at (first) admission
    samples: bool  # the model samples one token for this sequence this step


@dataclass(frozen=True, slots=True)
class SwapOut:
    request_id: RequestId
    pages: tuple[PageId, ...]


@dataclass(frozen=True, slots=True)
class SwapIn:
    request_id: RequestId
    pages: tuple[PageId, ...]


@dataclass(frozen=True, slots=True)
class StepPlan:
    now: float
    seqs: tuple[ScheduledSeq, ...]
    preempted: tuple[RequestId, ...] = ()
    swap_out: tuple[SwapOut, ...] = ()
    swap_in: tuple[SwapIn, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(s.end - s.start for s in self.seqs)


@dataclass(frozen=True, slots=True)
class CompactPlan:
    """A StepPlan as the simulator needs it (see `schedule_compact`): the same step, in the same order, but a
    sequence that decodes (computes the one token it sampled last) is its sequence's state, not a
    ScheduledSeq; its span is [start, start + 1) with start in `decode_starts` (in entry order)."""

    now: float
    entries: tuple  # ScheduledSeq, or the _Seq of a decoding sequence
    decode_starts: tuple[int, ...]
    preempted: tuple[RequestId, ...] = ()
    swap_out: tuple[SwapOut, ...] = ()
    swap_in: tuple[SwapIn, ...] = ()
    sampled_ids: tuple[RequestId, ...] = ()  # requests that receive a token at the end of the step, in entry order

    @property
    def others(self) -> tuple[ScheduledSeq, ...]:
        """The entries that are not decodes (prefill chunks, the last of which samples)."""
        return tuple(e for e in self.entries if type(e) is ScheduledSeq)


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """The next `steps` steps are certain to be pure decodes of the running sequences `request_ids` (in running
    order), each computing the token it sampled last, with nothing admitted or preempted, and nothing finished
    before the last step (see `decode_run`). In the run's step j (from 0) sequence i computes position `starts[i] + j`, so the step's
    decode spans sum to `starts_sum + j * len(request_ids)` and the longest starts at `longest_start + j`."""

    steps: int
    request_ids: tuple[RequestId, ...]
    starts_sum: int
    longest_start: int


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    request_id: RequestId
    prompt_tokens: int
    num_cached_tokens: int
    output: tuple[int, ...]
    finish_reason: str  # "length" or "stop"


@dataclass(slots=True, eq=False)
class _Seq:
    request: Request
    placement: Placement
    output: list[int] = field(default_factory=list)
    pages: list[PageId] = field(default_factory=list)
    match: PromptMatch | None = None
    num_computed: int = 0
    num_cached_tokens: int | None = None
    # Leading full pages already in the prefix index and locked through `match`: at least `borrowed`
    indexed_pages: int = 0
    swapped_pages: int = 0  # > 0 while swapped out to host
    # Leading pages whose one reference is the prefix index's, not the sequence's: the cached pages it matched
    # at admission and the pages it cached itself since (adopted: `insert`'s `adopt_at`). They stay locked
    # through `match` until `_release`, so nothing can free them under it; a second reference on each, taken
    # and dropped again at the finish, was a third of a long simulation's time.
    borrowed: int = 0
    _table: tuple[PageId, ...] | None = None  # `pages` as a tuple, rebuilt only after `pages` changes

    def page_table(self) -> tuple[PageId, ...]:
        """The page ids as an immutable tuple; cached, because a decode step adds a page only every page_size
        tokens and copying long tables every step dominated long simulations."""
        if self._table is None or len(self._table) != len(self.pages):  # `pages` only grows between resets
            self._table = tuple(self.pages)
        return self._table

    @property
    def length(self) -> int:
        return len(self.request.prompt) + len(self.output)

    @property
    def room(self) -> int:
        """Tokens it may still sample: the one that reaches max_new_tokens finishes it (see `_sampled`)."""
        return self.request.max_new_tokens - len(self.output)

    def tokens(self) -> np.ndarray:
        return np.concatenate([np.asarray(self.request.prompt, np.int32), np.asarray(self.output, np.int32)])


@dataclass(slots=True)
class Scheduler:
    index: PrefixIndex
    config: SchedulerConfig = SchedulerConfig()
    ledger: TenantLedger | None = None  # None: plain LRU eviction across tenants
    _waiting: deque = field(default_factory=deque)
    _running: list = field(default_factory=list)
    _seqs: dict = field(default_factory=dict)

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
        would free it, or leave it to two holders, under the sequence). Also checks the index and the pool."""
        self.index.check_integrity()
        pool = self.index.pool
        pool.check_integrity()
        holders = dict.fromkeys(self.index.cached_page_ids(), 1)
        evictable = set(self.index.evictable_page_ids())
        for seq in self._running:
            missing = [p for p in seq.pages[: seq.borrowed] if p not in holders]
            if missing:
                raise IntegrityError(f"{seq.request.request_id}: borrowed pages {missing[:8]} are not cached")
            unlocked = [p for p in seq.pages if p in evictable]
            if unlocked:
                raise IntegrityError(f"{seq.request.request_id}: its pages {unlocked[:8]} are cached unlocked "
                                     "(evictable while it runs)")
            for p in seq.pages[seq.borrowed :]:
                holders[p] = holders.get(p, 0) + 1
        wrong = [(p, pool.ref_count(p), n) for p, n in holders.items() if pool.ref_count(p) != n]
        in_use = pool.capacity - pool.num_free
        if wrong or in_use != len(holders):
            raise IntegrityError(f"reference counts (page, count, holders) {wrong[:8]}; {in_use} pages in use, "
                                 f"{len(holders)} held")

    def add(self, request: Request) -> None:
        if request.request_id in self._seqs:
            raise ValueError(f"request_id {request.request_id!r} is already scheduled; ids must be unique")
        need = self._pages_for(len(request.prompt) + request.max_new_tokens)
        if need > self.index.pool.capacity:
            # It could never be admitted and would wait forever: refuse it now.
            raise ValueError(f"request {request.request_id}: needs {need} pages, the pool holds "
                             f"{self.index.pool.capacity}; shorten the prompt or max_new_tokens")
        seq = _Seq(request, self.placement(request))
        self._seqs[request.request_id] = seq
        self._waiting.append(seq)

    def placement(self, request: Request) -> Placement:
        """Where the request's pages are cached (one namespace in strict isolation)."""
        return placement_for(request.tenant, request.prompt, shared_tokens=request.shared_tokens,
                             page_size=self.index.page_size, strict=self.config.strict_isolation)

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

    def allocate(self, seq: _Seq, n: int) -> None:
        seq.pages.extend(self.index.pool.allocate(n))

    def schedule(self, now: float) -> StepPlan:
        """Decide this step: running sequences first (decode or next prefill chunk), then admissions."""
        items, starts, preempted, swap_out, swap_in = self._schedule(now, compact=False)
        return StepPlan(now, tuple(items), tuple(preempted), tuple(swap_out), tuple(swap_in))

    def schedule_compact(self, now: float) -> CompactPlan:
        """`schedule(now)`, the same decisions and allocations in the same order, as a CompactPlan: a
        decoding sequence's entry is its own state instead of a new ScheduledSeq with a copy of its page
        table. For a caller that needs no page tables (the simulator): building a ScheduledSeq per sequence
        per step was most of a long simulation's time. Commit it with `postprocess_compact`."""
        items, starts, preempted, swap_out, swap_in = self._schedule(now, compact=True)
        sampled = tuple(e.request_id if type(e) is ScheduledSeq else e.request.request_id
                        for e in items if type(e) is not ScheduledSeq or e.samples)
        return CompactPlan(now, tuple(items), tuple(starts), tuple(preempted), tuple(swap_out), tuple(swap_in),
                           sampled)

    def _schedule(self, now: float, compact: bool) -> tuple[list, list, list, list, list]:
        budget = self.config.max_step_tokens
        items: list = []
        starts: list[int] = []
        preempted: list[RequestId] = []
        swap_out: list[SwapOut] = []
        swap_in: list[SwapIn] = []
        i, ps = 0, self.index.page_size
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            length = len(seq.request.prompt) + len(seq.output)  # seq.length, inlined: once per sequence per step
            n = min(length - seq.num_computed, budget)
            need = -(-(seq.num_computed + n) // ps) - len(seq.pages)  # _pages_for, inlined
            if need > 0:  # most decode steps stay inside their last page: nothing to allocate or preempt
                while not self.can_allocate(need, seq.request.tenant, now) and self._running[-1] is not seq:
                    self._preempt(self._running.pop(), now, preempted, swap_out)
                if not self.can_allocate(need, seq.request.tenant, now):
                    self._preempt(self._running.pop(i), now, preempted, swap_out)
                    continue
                self.allocate(seq, need)
            if compact and n == 1 and seq.num_computed + 1 == length:  # a decode
                items.append(seq)
                starts.append(seq.num_computed)
            else:
                items.append(self._item(seq, n))
            budget -= n
            i += 1
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs and not preempted:
            seq = self._waiting[0]
            if seq.swapped_pages:
                if not self.can_allocate(seq.swapped_pages, seq.request.tenant, now):
                    break
                self.allocate(seq, seq.swapped_pages)
                swap_in.append(SwapIn(seq.request.request_id, tuple(seq.pages)))
                seq.swapped_pages = 0
                self._running.append(self._waiting.popleft())
                continue  # resumes computing next step, after the copy
            if not self._admit(seq, budget, now, items):
                break
            budget -= items[-1].end - items[-1].start
            self._running.append(self._waiting.popleft())
        return items, starts, preempted, swap_out, swap_in

    def _admit(self, seq: _Seq, budget: int, now: float, items: list[ScheduledSeq]) -> bool:
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

    def _item(self, seq: _Seq, n: int) -> ScheduledSeq:
        end = seq.num_computed + n
        return ScheduledSeq(seq.request.request_id, seq.page_table(), seq.num_computed, end,
                            seq.num_cached_tokens or 0, samples=end == seq.length)

    def _index_computed(self, seq: _Seq, now: float) -> None:
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
        inserted = self.index.insert_prompt(seq.placement, tokens, seq.pages[:full], req.tenant, now,
                                            adopt_at=seq.borrowed)
        seq.borrowed += inserted.num_adopted
        match = PromptMatch(inserted.matches)
        self.index.lock_prompt(match, now)  # before the old lock goes: it keeps the adopted pages alive
        if seq.match is not None:
            self.index.unlock_prompt(seq.match)
        seq.match, seq.indexed_pages = match, full

    def _release(self, seq: _Seq, now: float, cache: bool) -> None:
        """Return a sequence's pages; with `cache`, its computed full pages go to the prefix index first."""
        req = seq.request
        if cache and seq.num_computed and self.config.prefix_caching:
            seq.borrowed += self.index.insert_prompt(seq.placement, seq.tokens()[: seq.num_computed], seq.pages,
                                                     req.tenant, now, adopt_at=seq.borrowed).num_adopted
        self.index.pool.release(seq.pages[seq.borrowed :] if seq.borrowed else seq.pages)
        if seq.match is not None:
            self.index.unlock_prompt(seq.match)
        seq.pages, seq.match, seq._table, seq.indexed_pages, seq.borrowed = [], None, None, 0, 0

    def _preempt(self, seq: _Seq, now: float, preempted: list, swap_out: list) -> None:
        preempted.append(seq.request.request_id)
        if self.config.allow_swap and seq.num_computed:
            swap_out.append(SwapOut(seq.request.request_id, tuple(seq.pages)))
            seq.swapped_pages = len(seq.pages)
            self._release(seq, now, cache=False)
        else:
            self._release(seq, now, cache=True)
            seq.num_computed = 0
        self._waiting.appendleft(seq)

    def finish(self, request_id: RequestId, now: float, reason: str = "abort",
               cache: bool = True) -> FinishedRequest | None:
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
        else:
            self._waiting.remove(seq)  # a waiting sequence holds no device pages
        return FinishedRequest(request_id, len(seq.request.prompt), seq.num_cached_tokens or 0,
                               tuple(seq.output), reason)

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

    def postprocess_compact(self, plan: CompactPlan, tokens: Sequence[int], now: float) -> tuple[FinishedRequest, ...]:
        """`postprocess` for a CompactPlan: `tokens[i]` is the token sampled for `plan.sampled_ids[i]`."""
        finished: list[FinishedRequest] = []
        k = 0
        ps, caching = self.index.page_size, self.config.prefix_caching
        for entry in plan.entries:
            if type(entry) is ScheduledSeq:
                seq = self._seqs[entry.request_id]
                seq.num_computed = entry.end
                self._index_computed(seq, now)
                if not entry.samples:
                    continue
            else:
                seq = entry
                seq.num_computed += 1
                if caching and min(seq.num_computed, len(seq.request.prompt)) // ps > seq.indexed_pages:
                    self._index_computed(seq, now)  # the quick check above is the first line of that
            if k >= len(tokens):
                raise ValueError(f"tokens: {len(tokens)} given, the plan samples more")
            self._sampled(seq, int(tokens[k]), now, finished)
            k += 1
        return tuple(finished)

    def decode_run(self) -> DecodeRun | None:
        """How many next steps are certain to be pure decodes of the running sequences, or None (not even one).

        Certain means that `schedule` step by step would admit nobody (nothing waiting, or no seat for another
        sequence), preempt nobody (every page the decodes reach is free or an evictable cached page; eviction
        is plain LRU: with a tenant ledger it depends on usage, and no run is offered), finish nobody before
        the run's last step (the sequences with the least room finish at its end; a request with stop tokens
        is never in a run, since its finish depends on what it samples), and index no prompt page (every
        prompt is computed). Carry it out with `commit_decode_run`; nothing may change the scheduler in
        between."""
        running, config, ps = self._running, self.config, self.index.page_size
        if (not running or self.ledger is not None or len(running) > config.max_step_tokens
                or (self._waiting and len(running) < config.max_num_seqs)):
            return None
        caching = config.prefix_caching
        steps = None
        firsts = []  # per sequence: the run step (from 1) whose token is the first beyond its pages
        for seq in running:
            req = seq.request
            prompt = len(req.prompt)
            if (not seq.output or seq.num_computed + 1 != prompt + len(seq.output) or req.stop_token_ids
                    or (caching and prompt // ps > seq.indexed_pages)):
                return None
            room = seq.room
            steps = room if steps is None else min(steps, room)
            firsts.append(len(seq.pages) * ps - seq.num_computed + 1)
        available = self.index.pool.num_free + self.index.evictable_pages

        def pages_for(k: int) -> int:  # pages the first k steps of the run allocate
            return sum((k - f) // ps + 1 for f in firsts if f <= k)

        low, high = (steps, steps) if pages_for(steps) <= available else (0, steps - 1)
        while low < high:  # the longest run whose pages can be had (pages_for grows with k)
            mid = (low + high + 1) // 2
            low, high = (mid, high) if pages_for(mid) <= available else (low, mid - 1)
        if low < 1:
            return None
        return DecodeRun(low, tuple(seq.request.request_id for seq in running),
                         sum(seq.num_computed for seq in running), max(seq.num_computed for seq in running))

    def commit_decode_run(self, run: DecodeRun, begins: Sequence[float],
                          tokens: Sequence[Sequence[int]]) -> CompactPlan:
        """Carry out the first `len(begins) - 1` steps of `run` and schedule the next one (step j begins at
        `begins[j]`; `tokens[i]` holds the tokens sequence i samples in the steps carried out) exactly as
        `schedule` and `postprocess` one step at a time would: the same pages allocated in the same order,
        evicting the same cached pages at the same times. Returns the last step's plan, which
        `postprocess_compact` commits like any other (its finishes, if any, then happen at its end)."""
        running, ps, k = self._running, self.index.page_size, len(begins)
        if not 0 < k <= run.steps or len(running) != len(run.request_ids) or len(tokens) != len(running):
            raise ValueError(f"commit_decode_run: {k} steps of a run of {run.steps}, {len(tokens)} token lists "
                             f"for {len(running)} running sequences; the run is not the scheduler's now")
        grows = []  # (step, running position): a step's new pages go in running order, as schedule takes them
        for i, seq in enumerate(running):
            grows.extend((j, i) for j in range(len(seq.pages) * ps - seq.num_computed, k, ps))
        grows.sort()
        # Free pages first, as can_allocate/allocate step by step would take them; then, the pool empty, each
        # new page is the one evicted for it at its step's begin time (one evict call for all of them).
        free = min(len(grows), self.index.pool.num_free)
        for j, i in grows[:free]:
            self.allocate(running[i], 1)
        if len(grows) > free:
            evicted = self.index.evict_each([begins[j] for j, _ in grows[free:]])
            for (j, i), page in zip(grows[free:], evicted):
                running[i].pages.append(page)
        for seq, sampled in zip(running, tokens):
            if len(sampled) != k - 1:
                raise ValueError(f"commit_decode_run: {len(sampled)} tokens for {seq.request.request_id}, "
                                 f"{k - 1} steps carried out")
            seq.num_computed += k - 1
            seq.output.extend(sampled)
        return CompactPlan(begins[-1], tuple(running), tuple(seq.num_computed for seq in running),
                           sampled_ids=run.request_ids)

    def _sampled(self, seq: _Seq, tok: int, now: float, finished: list[FinishedRequest]) -> None:
        """Append a sampled token; a request that stops or reaches max_new_tokens finishes."""
        seq.output.append(tok)
        req = seq.request
        stop = tok in req.stop_token_ids
        if stop or seq.room <= 0:
            self._release(seq, now, cache=True)
            self._running.remove(seq)
            del self._seqs[req.request_id]
            finished.append(FinishedRequest(req.request_id, len(req.prompt), seq.num_cached_tokens or 0,
                                            tuple(seq.output), "stop" if stop else "length"))
