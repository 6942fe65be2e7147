"""Prefix index on tiny pools: exact page ids and exact eviction order, narrated."""

import numpy as np
import pytest

from kvbench.engines.kvengine.core.adoption import adopt_pages
from kvbench.engines.kvengine.core.events import EventKind, EventLog
from kvbench.engines.kvengine.core.namespaces import SHARED_NAMESPACE, Namespace, Placement, TenantId, namespace_for
from kvbench.engines.kvengine.core.pages import IntegrityError, PagePool, PoolExhausted
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Scheduler

PS = 16
NS = Namespace("tenant:a")
A = TenantId("a")


def toks(*page_values: int, extra: int = 0) -> np.ndarray:
    """One page per value (all 16 tokens equal to it), then `extra` trailing tokens of -1."""
    return np.array([v for v in page_values for _ in range(PS)] + [-1] * extra, dtype=np.int32)


def cache(index: PrefixIndex, tokens: np.ndarray, now: float) -> list[int]:
    """Cache the pages of `tokens` the index lacks (match, lock, allocate, insert, release: `adopt_pages`)."""
    return list(adopt_pages(Scheduler(index), Placement(NS), tokens, A, now).pages)


def test_pool_hands_out_low_ids_and_reuses_last_released():
    pool = PagePool(11, PS)  # page 0 is the null page: 10 usable
    assert pool.allocate(3) == [1, 2, 3]
    assert pool.allocate(2) == [4, 5]
    assert pool.release([2, 3]) == 2
    assert pool.allocate(3) == [2, 3, 6]
    with pytest.raises(PoolExhausted):
        pool.allocate(6)
    pool.share([4])
    assert pool.release([4]) == 0 and pool.ref_count(4) == 1
    with pytest.raises(IntegrityError):
        pool.release([7])  # never allocated: the count would go negative
    pool.check_integrity()


def test_narrated_insert_match_split_and_lru_eviction():
    pool = PagePool(11, PS)
    events = EventLog()
    index = PrefixIndex(pool, events)
    # Request 1 caches pages A B C (ids 1 2 3) plus a half page that is never cached.
    assert cache(index, toks(10, 11, 12, extra=8), now=1.0) == [1, 2, 3]
    # Request 2 shares A B, then diverges with D E: the edge A-B-C splits after B; D E get ids 4 5.
    m = index.match(NS, toks(10, 11, 20, 21))
    assert m.pages == (1, 2) and m.num_tokens == 32
    assert cache(index, toks(10, 11, 20, 21), now=2.0) == [4, 5]
    # Request 3: a new prefix F G (ids 6 7).
    assert cache(index, toks(30, 31), now=3.0) == [6, 7]
    assert pool.num_free == 3 and index.evictable_pages == 7
    # Matching does not change the tree or recency.
    assert index.match(NS, toks(10, 11, 12, 13)).pages == (1, 2, 3)
    # A running request locks A B D E: those pages (and ancestors) are protected.
    locked = index.match(NS, toks(10, 11, 20, 21))
    index.lock(locked, now=4.0)
    assert (index.evictable_pages, index.protected_pages) == (3, 4)
    # Need 4 pages: the LRU unlocked leaf is C (t=1), then F G (t=3), deepest page first.
    res = index.evict(2, now=5.0)
    assert (res.num_pages, res.num_freed) == (2, 2)
    assert pool.num_free == 5
    assert index.match(NS, toks(10, 11, 12)).pages == (1, 2)  # C is gone
    assert index.match(NS, toks(30, 31)).pages == (6,)  # G went before F
    assert pool.allocate(2) == [7, 3]  # the two just freed, most recent first
    # Only F is evictable now; the locked path is untouchable.
    assert index.evict(5, now=6.0).num_pages == 1
    assert index.evictable_pages == 0 and index.protected_pages == 4
    index.unlock(locked)
    # Unlocked, A B D E is one chain again: E is evicted before D, D before A B.
    assert index.evict(1, now=7.0).num_pages == 1
    assert index.match(NS, toks(10, 11, 20, 21)).pages == (1, 2, 4)
    kinds = [(e.kind, e.num_pages) for e in events.take_events()]
    assert kinds == [
        (EventKind.STORED, 3),
        (EventKind.STORED, 2),
        (EventKind.STORED, 2),
        (EventKind.EVICTED, 2),
        (EventKind.EVICTED, 1),
        (EventKind.EVICTED, 1),
    ]
    assert events.take_events() == []
    pool.release([7, 3])
    index.check_integrity()
    pool.check_integrity()


def test_recency_decides_between_branches():
    pool = PagePool(11, PS)
    index = PrefixIndex(pool)
    cache(index, toks(1, 2), now=1.0)  # pages 1 2
    cache(index, toks(1, 3), now=2.0)  # page 3 under page 1
    used = index.match(NS, toks(1, 2))
    index.lock(used, now=3.0)  # a request uses 1 2 again: now 3 is the LRU leaf
    index.unlock(used)
    index.evict(1, now=4.0)
    assert index.match(NS, toks(1, 3)).pages == (1,)
    assert index.match(NS, toks(1, 2)).pages == (1, 2)
    index.check_integrity()


def test_namespaces_never_cross_in_strict_mode():
    pool = PagePool(11, PS)
    index = PrefixIndex(pool)
    ns_a = namespace_for(TenantId("a"), shareable=True, strict=True)
    ns_b = namespace_for(TenantId("b"), shareable=True, strict=True)
    pages = pool.allocate(2)
    index.insert(ns_a, toks(5, 6), pages, TenantId("a"), 0.0)
    assert index.match(ns_b, toks(5, 6)).num_pages == 0
    assert index.match(ns_a, toks(5, 6)).pages == tuple(pages)
    assert namespace_for(TenantId("b"), shareable=True, strict=False) == SHARED_NAMESPACE
    assert namespace_for(TenantId("b"), shareable=False, strict=False) == ns_b


def test_insert_rejects_too_few_pages():
    index = PrefixIndex(PagePool(11, PS))
    with pytest.raises(ValueError, match="pages"):
        index.insert(NS, toks(1, 2, 3), [1, 2], A, 0.0)


def test_insert_returns_what_match_then_finds():
    """An insert's `matches` are what `match` returns right after it: a new leaf, a path that ends inside an
    existing node (split there), one that extends a cached prefix, and one that is all cached already."""
    pool = PagePool(21, PS)
    index = PrefixIndex(pool)
    for tokens in (toks(1, 2, 3, 4), toks(1, 2, extra=5), toks(1, 2, 3, 4, 5, 6), toks(1, 2, 3), toks(7)):
        pages = pool.allocate(len(tokens) // PS)
        result = index.insert(NS, tokens, pages, A, 1.0)
        pool.release(pages)
        found = index.match(NS, tokens)
        (inserted,) = result.matches
        assert inserted == found and inserted._node is found._node
    index.check_integrity()
    pool.check_integrity()


def test_insert_adopts_the_callers_references_only_where_its_own_pages_begin():
    pool = PagePool(11, PS)
    index = PrefixIndex(pool)
    first = pool.allocate(2)  # [1, 2]
    r = index.insert(NS, toks(1, 2), first, A, now=1.0, adopt_at=0)
    assert (r.num_cached, r.num_adopted) == (0, 2)
    assert [pool.ref_count(p) for p in first] == [1, 1]  # the index took the caller's references over
    # A second prompt: pages 1-2 are cached; the caller owns its pages from 2 on, where the new ones begin.
    own = pool.allocate(2)  # [3, 4]
    r = index.insert(NS, toks(1, 2, 3, 4), first + own, A, now=2.0, adopt_at=2)
    assert (r.num_cached, r.num_adopted) == (2, 2)
    assert [pool.ref_count(p) for p in own] == [1, 1]
    # The caller's own pages begin at 1 (page 2 is a duplicate it holds): adopting would leave a hole, so
    # the index takes its own reference as without `adopt_at`, and the caller releases everything it owns.
    dup = pool.allocate(3)  # [5, 6, 7]
    r = index.insert(NS, toks(1, 2, 3, 4, 9), [first[0]] + dup[:1] + own + dup[2:], A, now=3.0, adopt_at=1)
    assert (r.num_cached, r.num_adopted) == (4, 0)
    assert pool.ref_count(dup[2]) == 2
    assert pool.release(dup) == 2  # the duplicate and the unused page go free; the adopted-by-share one stays
    assert pool.ref_count(dup[2]) == 1
    index.check_integrity()
    pool.check_integrity()


def test_insert_prompt_carries_adoption_from_the_shared_part_into_the_tenants_own():
    pool = PagePool(11, PS)
    index = PrefixIndex(pool)
    placement = Placement(NS, shared_pages=2)
    pages = pool.allocate(4)
    r = index.insert_prompt(placement, toks(1, 2, 3, 4), pages, A, now=1.0, adopt_at=0)
    assert (r.num_pages, r.num_cached, r.num_adopted) == (4, 0, 4)  # both parts: the caller holds none now
    assert [pool.ref_count(p) for p in pages] == [1, 1, 1, 1]
    # Another tenant's prompt with the same shared part: it borrows pages 1-2 and its own begin at page 2.
    other = Placement(Namespace("tenant:b"), shared_pages=2)
    own = pool.allocate(2)
    r = index.insert_prompt(other, toks(1, 2, 5, 6), pages[:2] + own, TenantId("b"), now=2.0, adopt_at=2)
    assert (r.num_cached, r.num_adopted) == (2, 2)
    assert [pool.ref_count(p) for p in pages[:2] + own] == [1, 1, 1, 1]
    index.check_integrity()
