"""The smallest sequences (found by test_scheduler_property.py) that broke the core under preemption, kept
step by step with exact pages, as vLLM's test_prefix_caching.py narrates its cases.

Both are one mistake. A sequence preempted after it generated tokens caches its computed pages, its own
generated ones too. Readmitted, it matches them and borrows them (their one reference is the index's, kept
alive by the sequence's lock). Its first postprocess then indexed its prompt's full pages again and moved
its lock to that shorter path: the borrowed pages past the prompt were left unlocked, evictable while it
still computes in them. Eviction handed such a page to another sequence, and two sequences wrote into one
page; when they finished, caching it again failed as "share() of a free or null page" (the page had been
freed), or a decode run's eviction found "page N dropped from the index has another holder".

Page size 2, two prompts sharing their first page (tokens 0, 1); every sampled token is 7."""

from __future__ import annotations

import numpy as np

from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Request, RequestId, Scheduler, SchedulerConfig

PS = 2
TOKEN = 7


def scheduler(usable_pages: int, *requests: tuple[str, list[int], int]) -> Scheduler:
    sched = Scheduler(PrefixIndex(PagePool(1 + usable_pages, PS)), SchedulerConfig(max_step_tokens=64))
    for rid, tokens, max_new in requests:
        sched.add(Request(RequestId(rid), np.array(tokens, np.int32), max_new_tokens=max_new))
    return sched


def engine_step(sched: Scheduler, t: int):
    """One step of the engine's path; the plan's (request, start, end, page table) and the finished ids."""
    plan = sched.schedule(float(t))
    done = sched.postprocess(plan, {s.request_id: TOKEN for s in plan.seqs if s.samples}, t + 1.0)
    sched.check_integrity()
    return (
        [(s.request_id, s.start, s.end, s.page_table) for s in plan.seqs],
        plan.preempted,
        [f.request_id for f in done],
    )


def test_a_readmitted_sequence_keeps_its_borrowed_generated_page_locked_engine_path():
    """Raised "share() of a free or null page" (scheduler._release -> insert_prompt -> pool.share) at t=4."""
    sched = scheduler(5, ("A", [0, 1, 100], 5), ("B", [0, 1, 200], 4))
    # t=0: both admitted in one step, so B does not find A's first page yet: A [1, 2], B [3, 4]. A's page 1
    # enters the index (adopted); B's copy, page 3, is a duplicate B keeps. Page 5 is free.
    assert engine_step(sched, 0) == ([("A", 0, 3, (1, 2)), ("B", 0, 3, (3, 4))], (), [])
    # t=1: both decode position 3, still inside their second page.
    assert engine_step(sched, 1) == ([("A", 3, 4, (1, 2)), ("B", 3, 4, (3, 4))], (), [])
    # t=2: A's position 4 takes page 5. B's needs a page too: none is free or evictable, so B, the latest
    # admitted, is preempted. Its 4 computed tokens are cached: page 3 duplicates page 1 and is freed; page 4
    # (B's prompt token 200 and its first sampled token) is cached under page 1, unlocked.
    assert engine_step(sched, 2) == ([("A", 4, 5, (1, 2, 5))], ("B",), [])
    assert sched.index.pool.num_free == 1 and sorted(sched.index.cached_page_ids()) == [1, 4]
    assert sched.index.evictable_pages == 1
    # t=3: B is readmitted and borrows pages 1 and 4 (past its one full prompt page); page 3 is its new one.
    assert engine_step(sched, 3) == ([("A", 5, 6, (1, 2, 5)), ("B", 4, 5, (1, 4, 3))], (), [])
    # Every cached page is one that A or B computes in, so none may be evictable. The bug: B's lock had moved
    # to page 1 alone, and page 4 was evictable.
    evictable_at_3 = sched.index.evictable_pages
    # t=4: A's position 6 needs a page and none is evictable: B is preempted again, A takes page 3 and
    # finishes. (The bug evicted B's page 4 for A instead: A finished and freed it, then B finished, and
    # caching B's pages shared the free page 4.)
    assert engine_step(sched, 4) == ([("A", 6, 7, (1, 2, 5, 3))], ("B",), ["A"])
    # t=5: B comes back, borrows pages 1 and 4 again and computes its last two tokens in page 3.
    assert engine_step(sched, 5) == ([("B", 4, 6, (1, 4, 3))], (), ["B"])
    assert evictable_at_3 == 0
    assert not sched.has_work() and sched.index.pool.num_free == 0
    assert all(sched.index.pool.ref_count(p) == 1 for p in sched.index.cached_page_ids())


def run_step(sched: Scheduler, t: int):
    """The simulator's way (`SimNode.fast_forward` / `begin_step`): a decode run in one pass where the
    scheduler offers one, else one compact step. Returns the next step, the last plan's (request, start,
    page table) and what finished."""
    run = sched.decode_run()
    if run is None:
        plan = sched.schedule_compact(float(t))
    else:
        tokens = [[TOKEN] * (run.steps - 1) for _ in run.request_ids]
        plan = sched.commit_decode_run(run, [float(t + j) for j in range(run.steps)], tokens)
        t += run.steps - 1
    starts = iter(plan.decode_starts)
    entries = [
        (e.request_id, e.start, e.page_table)
        if hasattr(e, "start")
        else (e.request.request_id, next(starts), e.page_table())
        for e in plan.entries
    ]
    done = sched.postprocess_compact(plan, [TOKEN] * len(plan.sampled_ids), t + 1.0)
    sched.check_integrity()
    return t + 1, entries, plan.preempted, [f.request_id for f in done]


def test_a_decode_run_never_evicts_a_page_a_running_sequence_borrowed():
    """Raised "evict_each: page 5 dropped from the index has another holder" (node.fast_forward ->
    commit_decode_run -> prefix_index.evict_each) in the last decode run of A."""
    sched = scheduler(6, ("A", [0, 1, 100], 9), ("B", [0, 1, 200, 201, 202], 4))
    steps, t = [], 0
    while sched.has_work():  # (the step a run or a step began, its last plan, preempted, finished, evictable)
        begin = t
        t, entries, preempted, done = run_step(sched, t)
        steps.append((begin, entries, preempted, done, sched.index.evictable_pages))
    assert steps == [
        # t=0: A [1, 2]; B [3, 4, 5] (2 full prompt pages and one token). Cached: page 1, and B's page 4 under
        # it (B's page 3 duplicates page 1). Page 6 is free.
        (0, [("A", 0, (1, 2)), ("B", 0, (3, 4, 5))], (), [], 0),
        # t=1: a one-step decode run: the next step needs a page for each and one is left.
        (1, [("A", 3, (1, 2)), ("B", 5, (3, 4, 5))], (), [], 0),
        # t=2: A's position 4 takes page 6; B's position 6 finds nothing: B is preempted. Page 5 (B's prompt
        # token 202 and its first sampled token) is cached under page 4, unlocked; page 3 is freed.
        (2, [("A", 4, (1, 2, 6))], ("B",), [], 2),
        # t=3: B, readmitted, borrows pages 1, 4 and 5 (one past its prompt) and takes page 3. Nothing cached
        # is evictable. (The bug moved B's lock to pages 1 and 4: page 5 was evictable under B.)
        (3, [("A", 5, (1, 2, 6)), ("B", 6, (1, 4, 5, 3))], (), [], 0),
        # t=4: A's position 6 needs a page and nothing is evictable, so this is no decode run: B is preempted
        # and A takes page 3. (The bug ran it as a decode run that evicted B's page 5 for A; B then finished
        # and cached page 5 again, still A's, and A's next run's eviction of it raised.)
        (4, [("A", 6, (1, 2, 6, 3))], ("B",), [], 2),
        # t=5..10: A decodes alone, in runs up to each page it needs, evicting B's cached pages 5 and 4 for its
        # positions 8 and 10, and finishes.
        (5, [("A", 7, (1, 2, 6, 3))], (), [], 2),
        (6, [("A", 8, (1, 2, 6, 3, 5))], (), [], 1),
        (7, [("A", 9, (1, 2, 6, 3, 5))], (), [], 1),
        (8, [("A", 10, (1, 2, 6, 3, 5, 4))], (), ["A"], 5),
        # t=9: B comes back: only page 1 is left of its prefix; it recomputes its 6 other tokens and finishes.
        (9, [("B", 2, (1, 3, 5, 4))], (), ["B"], 6),
    ]
