"""Scheduler plans on hand-checked cases, and a full request lifecycle with a fake model."""

import numpy as np
import pytest

from kvbench.engines.kvengine.core.namespaces import namespace_for
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import DEFAULT_TENANT, Request, RequestId, Scheduler, SchedulerConfig

PS = 16


def prompt(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n, dtype=np.int32)


def fake_model(plan) -> dict:
    """Samples token 7 for every sequence that finished its prefill or decoded."""
    return {s.request_id: 7 for s in plan.seqs if s.samples}


def step(sched: Scheduler, now: float):
    plan = sched.schedule(now)
    return plan, sched.postprocess(plan, fake_model(plan), now)


def test_chunked_prefill_splits_under_token_budget():
    sched = Scheduler(PrefixIndex(PagePool(41, PS)), SchedulerConfig(max_step_tokens=64))
    sched.add(Request(RequestId("r1"), prompt(100, 1), max_new_tokens=2))
    sched.add(Request(RequestId("r2"), prompt(40, 2), max_new_tokens=1))
    plan, _ = step(sched, 0.0)  # r1 takes the whole budget: tokens [0, 64), pages 1-4
    assert [(s.request_id, s.start, s.end, s.samples) for s in plan.seqs] == [("r1", 0, 64, False)]
    assert plan.seqs[0].page_table == (1, 2, 3, 4)
    plan, _ = step(sched, 1.0)  # r1's last 36 tokens (pages 5-7), then r2's first 28 tokens (pages 8-9)
    assert [(s.request_id, s.start, s.end, s.samples) for s in plan.seqs] == [
        ("r1", 64, 100, True),
        ("r2", 0, 28, False),
    ]
    assert plan.seqs[0].page_table == (1, 2, 3, 4, 5, 6, 7) and plan.seqs[1].page_table == (8, 9)
    plan, done = step(sched, 2.0)  # r1 decodes its sampled token (position 100); r2 finishes its prefill
    assert [(s.request_id, s.start, s.end, s.samples) for s in plan.seqs] == [
        ("r1", 100, 101, True),
        ("r2", 28, 40, True),
    ]
    assert [f.request_id for f in done] == ["r1", "r2"]
    assert done[0].output == (7, 7) and done[1].output == (7,)
    assert not sched.has_work()


def test_lifecycle_prefix_reuse_and_eviction_under_pressure():
    pool = PagePool(11, PS)  # 10 usable pages
    index = PrefixIndex(pool)
    sched = Scheduler(index, SchedulerConfig(max_step_tokens=48))
    system = prompt(64, 3)  # 4 full pages shared by both requests
    sched.add(Request(RequestId("a"), np.concatenate([system, prompt(20, 4)]), max_new_tokens=3))
    plans = []
    while sched.has_work():
        plan, done = step(sched, float(len(plans)))
        plans.append(plan)
    # a: prefill 84 tokens in chunks of 48 and 36, then 2 decode steps.
    assert [(p.seqs[0].start, p.seqs[0].end) for p in plans] == [(0, 48), (48, 84), (84, 85), (85, 86)]
    assert done[0].num_cached_tokens == 0 and done[0].output == (7, 7, 7)
    # Finished: its 5 computed full pages (86 tokens) are cached, everything else is free again.
    assert index.cached_pages == 5 and pool.num_free == 5
    # b shares the system prompt: 64 tokens cached at admission, it computes only its own 30.
    sched.add(Request(RequestId("b"), np.concatenate([system, prompt(30, 5)]), max_new_tokens=1))
    plan, done = step(sched, 10.0)
    assert (plan.seqs[0].start, plan.seqs[0].end, plan.seqs[0].num_cached_tokens) == (64, 94, 64)
    assert plan.seqs[0].page_table[:4] == plans[1].seqs[0].page_table[:4] == (1, 2, 3, 4)
    assert done[0].num_cached_tokens == 64
    # Cached now: a's 5 pages + b's 1 new full page = 6; 4 free. c needs 9 pages, nothing shared: 5 are
    # evicted, LRU leaf first: a's tail page (last used at t=3), then b's tail, then the system prompt's
    # pages deepest first, leaving its first page.
    sched.add(Request(RequestId("c"), prompt(140, 6), max_new_tokens=1))
    done, now = (), 20.0
    while not done:  # 140 tokens in chunks of 48
        _, done = step(sched, now)
        now += 1
    assert done[0].request_id == "c" and done[0].num_cached_tokens == 0
    assert index.match(namespace_for(DEFAULT_TENANT, shareable=False, strict=True), system).pages == (1,)
    assert index.cached_pages == 1 + 8 and pool.num_free == 1
    index.check_integrity()
    pool.check_integrity()


def test_a_running_request_shares_its_computed_prefix_before_it_finishes():
    """Prompt pages enter the cache as they are computed: a request arriving while another with the same
    prefix is still decoding reuses that prefix's full pages (and chunk by chunk, a long prefill's first
    chunks)."""
    pool = PagePool(41, PS)
    index = PrefixIndex(pool)
    sched = Scheduler(index, SchedulerConfig(max_step_tokens=64))
    shared = prompt(56, 1)  # 3 full pages + 8 tokens
    sched.add(Request(RequestId("a"), shared, max_new_tokens=20))
    step(sched, 0.0)  # a prefilled (56 tokens), first token sampled
    step(sched, 1.0)  # a decodes
    sched.add(Request(RequestId("b"), np.concatenate([shared[:48], prompt(30, 2)]), max_new_tokens=2))
    plan, _ = step(sched, 2.0)
    b = next(s for s in plan.seqs if s.request_id == "b")
    assert b.num_cached_tokens == 48 and b.start == 48  # a's 3 full pages, while a is still running
    a = next(s for s in plan.seqs if s.request_id == "a")
    assert a.page_table[:3] == b.page_table[:3]
    # The pages a computed are locked by a while it runs: a full pool evicts none of them.
    assert index.evict(100, 3.0).num_freed == 0
    index.check_integrity()
    pool.check_integrity()


def test_preemption_takes_the_latest_admitted_and_recompute_reuses_its_pages():
    pool = PagePool(7, PS)  # 6 usable pages
    index = PrefixIndex(pool)
    sched = Scheduler(index, SchedulerConfig(max_step_tokens=256))
    sched.add(Request(RequestId("old"), prompt(47, 7), max_new_tokens=40))
    sched.add(Request(RequestId("new"), prompt(47, 8), max_new_tokens=40))
    plan, _ = step(sched, 0.0)  # both prefilled: 3 pages each, pool full
    assert pool.num_free == 0 and [s.request_id for s in plan.seqs] == ["old", "new"]
    plan, _ = step(sched, 1.0)  # both decode position 47 (fits in page 3)
    assert plan.preempted == ()
    plan, _ = step(sched, 2.0)  # position 48 needs a 4th page for "old": "new" is preempted
    assert plan.preempted == ("new",) and [s.request_id for s in plan.seqs] == ["old"]
    # Each had 48 computed tokens = 3 full pages, of which the first 2 are full prompt pages (47-token
    # prompts), in the cache as soon as computed: "old" keeps its 2 locked. "new" was preempted: its 3 pages
    # went to the cache unlocked, and its last one was evicted to give "old" its 4th page. On readmission
    # "new" reuses the 2 pages left.
    assert index.cached_pages == 2 + 2 and pool.num_free == 0
    assert sched.num_waiting == 1
    index.check_integrity()
    pool.check_integrity()


def test_swap_preemption_lists_pages_to_copy():
    pool = PagePool(7, PS)
    sched = Scheduler(PrefixIndex(pool), SchedulerConfig(max_step_tokens=256, allow_swap=True))
    sched.add(Request(RequestId("old"), prompt(47, 7), max_new_tokens=4))
    sched.add(Request(RequestId("new"), prompt(47, 8), max_new_tokens=40))
    step(sched, 0.0)
    step(sched, 1.0)
    plan, _ = step(sched, 2.0)
    assert [s.request_id for s in plan.swap_out] == ["new"] and plan.swap_out[0].pages == (4, 5, 6)
    _, done = step(sched, 3.0)  # "old" finishes; its pages are released
    assert [f.request_id for f in done] == ["old"]
    plan, _ = step(sched, 4.0)  # "new" comes back: new pages to copy into, same computed tokens
    assert [s.request_id for s in plan.swap_in] == ["new"] and len(plan.swap_in[0].pages) == 3
    plan, _ = step(sched, 5.0)
    assert (plan.seqs[0].request_id, plan.seqs[0].start) == ("new", 48)


def test_a_prompt_sharing_part_of_a_long_cached_node_is_admitted_in_a_full_pool():
    """Regression: the lock of a match used to pin the whole last node, so in a full pool a request sharing
    only its head could never be admitted (the engine hung at concurrency 1 with a small KV tier)."""
    index = PrefixIndex(PagePool(11, 16))  # 10 usable pages
    sched = Scheduler(index, SchedulerConfig(max_step_tokens=1024))
    head = prompt(32, 1)  # 2 pages both requests share
    first = np.concatenate([head, prompt(112, 2)])  # 144 tokens + 8 out = 152: 10 pages
    sched.add(Request(RequestId("a"), first, max_new_tokens=8))
    while sched.has_work():
        plan = sched.schedule(0.0)
        sched.postprocess(plan, {item.request_id: 5 for item in plan.seqs if item.samples}, 0.0)
    # "a" finished: its 151 computed tokens (the last output is never fed back) leave one cached node of 9
    # full pages; 1 page is free.
    assert index.cached_pages == 9 and index.pool.num_free == 1
    second = np.concatenate([head, prompt(120, 3)])  # 152 tokens + 8 out = 10 pages, 2 of them cached
    sched.add(Request(RequestId("b"), second, max_new_tokens=8))
    plan = sched.schedule(1.0)
    # Admitted: the shared 2-page head is reused; the 7-page tail of "a" was evicted to make room for 8 pages.
    assert [item.request_id for item in plan.seqs] == ["b"]
    assert plan.seqs[0].num_cached_tokens == 32
    index.check_integrity()
    index.pool.check_integrity()


def test_a_request_that_can_never_fit_is_refused_at_add():
    sched = Scheduler(PrefixIndex(PagePool(5, 16)))
    with pytest.raises(ValueError, match="needs 5 pages, the pool holds 4"):
        sched.add(Request(RequestId("big"), prompt(70, 1), max_new_tokens=1))


def test_shared_prefix_isolation_shares_the_declared_prefix_and_nothing_after_it():
    """Tenant a sends a declared 2-page system prompt and 3 pages of its own; tenant b sends the very same
    tokens: b reuses the system prompt's pages (the same page ids), never a's 3 private pages, and keeps
    its own copy of them for itself."""
    pool = PagePool(41, PS)
    index = PrefixIndex(pool)
    sched = Scheduler(index, SchedulerConfig(strict_isolation=False))
    system, private = prompt(32, 1), prompt(48, 2)
    tokens = np.concatenate([system, private, prompt(1, 3)])

    def serve(request_id: str, tenant: str, shared_tokens: int, now: float):
        sched.add(Request(RequestId(request_id), tokens, 1, tenant=tenant, shared_tokens=shared_tokens))
        plan, done = step(sched, now)
        return plan.seqs[0], done[0]

    a, _ = serve("a", "a", 32, 0.0)
    assert a.num_cached_tokens == 0 and a.page_table[:5] == (1, 2, 3, 4, 5)
    b, _ = serve("b", "b", 32, 1.0)
    assert b.num_cached_tokens == 32 and b.page_table[:2] == (1, 2)  # the system prompt only
    assert b.page_table[2:5] != (3, 4, 5)
    b2, _ = serve("b2", "b", 32, 2.0)
    assert b2.num_cached_tokens == 80 and b2.page_table[2:5] == b.page_table[2:5]  # b's own copy
    # Not declared, nothing is shared: strict as far as a third tenant is concerned.
    c, _ = serve("c", "c", 0, 3.0)
    assert c.num_cached_tokens == 0
    index.check_integrity()
    pool.check_integrity()


def test_shared_tokens_are_the_longest_common_prefix_with_a_declared_prefix():
    from kvbench.engines.kvengine.core.namespaces import shared_tokens_of

    declared = [np.arange(10), np.arange(100, 140)]
    assert shared_tokens_of(np.arange(20), declared) == 10
    assert shared_tokens_of(np.concatenate([np.arange(100, 130), [7]]), declared) == 30  # diverges at 30
    assert shared_tokens_of(np.arange(5), declared) == 5
    assert shared_tokens_of(np.arange(50, 60), declared) == 0
    assert shared_tokens_of(np.arange(20), []) == 0


def test_shared_prefix_pages_over_two_namespaces_are_counted_once_per_holder():
    """Two tenants share a declared 48-token prefix (its own namespace) and then diverge; they run together,
    one is preempted in a small pool and readmitted, and both finish. After every step each page's reference
    count is its holders (the index, and each sequence's own pages beyond what it borrowed from the index),
    and the shared pages end up cached once, with one reference."""
    shared = prompt(48, 9)
    sched = Scheduler(PrefixIndex(PagePool(1 + 11, PS)), SchedulerConfig(max_step_tokens=64, strict_isolation=False))
    requests = [
        Request(
            RequestId(f"r{k}"),
            np.concatenate([shared, prompt(40, k)]),
            max_new_tokens=40,
            tenant=tenant,
            shared_tokens=48,
        )
        for k, tenant in enumerate(["a", "b"])
    ]
    sched.add(requests[0])
    now, preempted, done = 0.0, [], {}
    while sched.has_work() and now < 400:
        if now == 3.0:
            sched.add(requests[1])  # after r0 cached the shared prefix: r1 borrows it
        plan, finished = step(sched, now)
        preempted += plan.preempted
        done.update({f.request_id: f for f in finished})
        sched.check_integrity()
        now += 1.0
    assert set(done) == {"r0", "r1"} and done["r1"].num_cached_tokens >= 48
    assert preempted, "the pool is meant to be too small for both"
    index = sched.index
    assert all(index.pool.ref_count(p) == 1 for p in index.cached_page_ids())
    assert index.match(namespace_for(DEFAULT_TENANT, shareable=True, strict=False), shared).num_pages == 3
