"""Adopting restored pages on tiny pools: exact page ids, what is filled, what is evicted to make room."""

import numpy as np
import pytest

from kvbench.engines.kvengine.core.adoption import Adoption, adopt_pages
from kvbench.engines.kvengine.core.namespaces import Namespace, Placement, TenantId
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Scheduler

PS = 4
A = TenantId("a")
HERE = Placement(Namespace("tenant:a"))


def toks(*page_values: int) -> np.ndarray:
    """One page per value (all PS tokens equal to it)."""
    return np.repeat(np.array(page_values, dtype=np.int32), PS)


def scheduler(usable_pages: int) -> Scheduler:
    return Scheduler(PrefixIndex(PagePool(usable_pages + 1, PS)))  # + the null page


def check(s: Scheduler) -> None:
    s.index.pool.check_integrity()
    s.index.check_integrity()


def test_restored_pages_join_the_device_prefix_with_exact_ids_and_no_lock_left():
    s = scheduler(10)
    # The device holds A B (pages 1 2); a restore brings C D, the prompt's pages 2 and 3.
    assert adopt_pages(s, HERE, toks(10, 11), A, now=1.0) == Adoption(0, (1, 2))
    filled = []
    adoption = adopt_pages(
        s,
        HERE,
        toks(10, 11, 12, 13),
        A,
        now=2.0,
        first_page=2,
        fill=lambda first, pages: filled.append((first, list(pages))),
    )
    assert adoption == Adoption(matched_pages=2, pages=(3, 4))
    assert filled == [(2, [3, 4])]  # prompt page 2 -> page 3, prompt page 3 -> page 4, before the index took them
    assert s.index.match_prompt(HERE, toks(10, 11, 12, 13)).pages == (1, 2, 3, 4)
    # The index holds the only reference to each page, and nothing stays locked.
    assert [s.index.pool.ref_count(p) for p in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert (s.index.evictable_pages, s.index.protected_pages, s.index.pool.num_free) == (4, 0, 6)
    check(s)


def test_nothing_changes_when_the_restore_no_longer_connects_or_nothing_is_missing():
    s = scheduler(10)
    adopt_pages(s, HERE, toks(10, 11, 12), A, now=1.0)  # pages 1 2 3
    s.index.evict(2, now=2.0)  # the device lost B C meanwhile: it holds A only
    called = []
    # The restore read pages from 2 on, but page 1 (B) is gone: it cannot be adopted after A.
    gap = adopt_pages(s, HERE, toks(10, 11, 12, 13), A, now=3.0, first_page=2, fill=lambda *a: called.append(a))
    assert gap == Adoption(matched_pages=1) and not called
    assert s.index.pool.num_free == 9 and s.index.cached_pages == 1
    # Everything already on device: nothing to adopt, and recency is not touched.
    assert adopt_pages(s, HERE, toks(10), A, now=4.0, fill=lambda *a: called.append(a)) == Adoption(1)
    assert not called
    check(s)


def test_room_is_made_by_evicting_lru_pages_but_never_the_matched_prefix():
    s = scheduler(4)
    adopt_pages(s, HERE, toks(20, 21), A, now=1.0)  # X Y: pages 1 2, the least recently used
    adopt_pages(s, HERE, toks(10), A, now=2.0)  # A: page 3; one page free (4)
    # Restoring B C after A needs 2 pages, 1 is free: Y (page 2, the LRU leaf's deepest page) is evicted,
    # A is locked meanwhile. The freed page is reused first.
    adoption = adopt_pages(s, HERE, toks(10, 11, 12), A, now=3.0, first_page=1)
    assert adoption == Adoption(1, (2, 4))
    assert s.index.match_prompt(HERE, toks(20, 21)).pages == (1,)
    assert s.index.match_prompt(HERE, toks(10, 11, 12)).pages == (3, 2, 4)
    check(s)


def test_no_room_leaves_everything_as_it_was():
    s = scheduler(3)
    adopt_pages(s, HERE, toks(10), A, now=1.0)  # page 1
    held = s.index.pool.allocate(2)  # a running request holds the other two pages
    assert adopt_pages(s, HERE, toks(10, 11, 12), A, now=2.0, first_page=1) == Adoption(1, no_room=True)
    assert s.index.match_prompt(HERE, toks(10, 11, 12)).pages == (1,)
    assert (s.index.evictable_pages, s.index.protected_pages) == (1, 0)  # the match's lock was released
    s.index.pool.release(held)
    check(s)


def test_a_fill_that_fails_gives_its_pages_back():
    s = scheduler(4)

    def broken(first, pages):
        raise OSError("the restored bytes could not be written")

    with pytest.raises(OSError):
        adopt_pages(s, HERE, toks(10, 11), A, now=1.0, fill=broken)
    assert s.index.pool.num_free == 4 and s.index.cached_pages == 0
    check(s)
