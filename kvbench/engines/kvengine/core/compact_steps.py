"""The scheduler's simulator paths: the same steps as `schedule` / `postprocess`, as CompactPlans (no page
table per decode: `schedule_compact`, `postprocess_compact`), and runs of steps certain to be pure decodes
carried out in one pass (`decode_run`, `commit_decode_run`: the same pages, evictions and tokens as step by
step). `Scheduler` inherits them; the sequences, the index and the step itself are the scheduler's.
"""

from __future__ import annotations

from typing import Sequence

from kvbench.engines.kvengine.core.plans import CompactPlan, DecodeRun, FinishedRequest, ScheduledSeq


class CompactSteps:
    """`schedule_compact`, `postprocess_compact`, `decode_run` and `commit_decode_run` of Scheduler (whose
    state and step they use; see its module docstring)."""

    __slots__ = ()

    def schedule_compact(self, now: float) -> CompactPlan:
        """`schedule(now)`, the same decisions and allocations in the same order, as a CompactPlan: a
        decoding sequence's entry is its own state instead of a new ScheduledSeq with a copy of its page
        table. For a caller that needs no page tables (the simulator): building a ScheduledSeq per sequence
        per step was most of a long simulation's time. Commit it with `postprocess_compact`."""
        items, starts, preempted, swap_out, swap_in = self._schedule(now, compact=True)
        sampled = tuple(
            e.request_id if type(e) is ScheduledSeq else e.request.request_id
            for e in items
            if type(e) is not ScheduledSeq or e.samples
        )
        return CompactPlan(now, tuple(items), tuple(starts), tuple(preempted), tuple(swap_out), tuple(swap_in), sampled)

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
        if (
            not running
            or self.ledger is not None
            or len(running) > config.max_step_tokens
            or (self._waiting and len(running) < config.max_num_seqs)
        ):
            return None
        caching = config.prefix_caching
        steps = None
        firsts = []  # per sequence: the run step (from 1) whose token is the first beyond its pages
        for seq in running:
            req = seq.request
            prompt = len(req.prompt)
            if (
                not seq.output
                or seq.num_computed + 1 != prompt + len(seq.output)
                or req.stop_token_ids
                or (caching and prompt // ps > seq.indexed_pages)
            ):
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
        return DecodeRun(
            low,
            tuple(seq.request.request_id for seq in running),
            sum(seq.num_computed for seq in running),
            max(seq.num_computed for seq in running),
        )

    def commit_decode_run(
        self, run: DecodeRun, begins: Sequence[float], tokens: Sequence[Sequence[int]]
    ) -> CompactPlan:
        """Carry out the first `len(begins) - 1` steps of `run` and schedule the next one (step j begins at
        `begins[j]`; `tokens[i]` holds the tokens sequence i samples in the steps carried out) exactly as
        `schedule` and `postprocess` one step at a time would: the same pages allocated in the same order,
        evicting the same cached pages at the same times. Returns the last step's plan, which
        `postprocess_compact` commits like any other (its finishes, if any, then happen at its end)."""
        running, ps, k = self._running, self.index.page_size, len(begins)
        if not 0 < k <= run.steps or len(running) != len(run.request_ids) or len(tokens) != len(running):
            raise ValueError(
                f"commit_decode_run: {k} steps of a run of {run.steps}, {len(tokens)} token lists "
                f"for {len(running)} running sequences; the run is not the scheduler's now"
            )
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
                raise ValueError(
                    f"commit_decode_run: {len(sampled)} tokens for {seq.request.request_id}, {k - 1} steps carried out"
                )
            seq.num_computed += k - 1
            seq.output.extend(sampled)
        return CompactPlan(
            begins[-1], tuple(running), tuple(seq.num_computed for seq in running), sampled_ids=run.request_ids
        )
