"""A hybrid model's stale sliding-window pages (sim/hybrid_cache.py) on a hand-worked pool."""

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.plans import SchedulerConfig
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Scheduler
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hybrid_cache import StaleSliding

DEFAULT_TENANT = TenantId("default")


def scheduler(pages: int) -> Scheduler:
    return Scheduler(PrefixIndex(PagePool(1 + pages, 4)), SchedulerConfig(max_step_tokens=64))


def test_gpt_oss_keeps_one_stale_page_per_full_page_and_a_dense_model_none():
    stale = StaleSliding.of(load_geometry("gpt-oss-120b"), 128)
    assert (stale.window, stale.ratio) == (128, 1.0)  # 18 sliding of 36 layers, window 128
    assert StaleSliding.of(load_geometry("qwen3-32b"), 64) is None


def test_the_pages_that_left_the_window_become_cached_evictable_pages():
    # Window 8 tokens, page 4: computing tokens [0, 32) moves pages 0-5 out of the window (24 tokens behind
    # position 32); [32, 40) two more. With one sliding layer per full one, each costs one pool page.
    stale = StaleSliding(window=8, ratio=1.0, page_size=4)
    assert stale.left_window(0, 32) == 6 and stale.left_window(32, 40) == 2 and stale.left_window(0, 8) == 0
    sched = scheduler(10)
    assert stale.cache(sched, DEFAULT_TENANT, 6, now=1.0) == 6
    index = sched.index
    assert index.pool.num_free == 4 and index.evictable_pages == 6 and stale.pages_cached == 6
    # They hold the pool until needed: an allocation of 8 pages evicts 4 of them (least recently cached first).
    assert sched.can_allocate(8, DEFAULT_TENANT, now=2.0)
    assert index.evictable_pages == 2
    index.pool.allocate(8)  # a request holds them
    # Two more go stale: the pool is full, so the two older stale pages are evicted for them.
    assert stale.cache(sched, DEFAULT_TENANT, 2, now=3.0) == 2 and index.evictable_pages == 2
    # With every page held and nothing evictable, nothing goes stale (vLLM would have reused the block).
    assert sched.can_allocate(2, DEFAULT_TENANT, now=4.0)
    index.pool.allocate(2)
    assert index.evictable_pages == 0 and stale.cache(sched, DEFAULT_TENANT, 2, now=5.0) == 0


def test_a_fractional_ratio_carries_its_remainder():
    stale = StaleSliding(window=4, ratio=0.5, page_size=4)
    sched = scheduler(10)
    assert [stale.cache(sched, DEFAULT_TENANT, 3, now=float(t)) for t in range(3)] == [1, 2, 1]
