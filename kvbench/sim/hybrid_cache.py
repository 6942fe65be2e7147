"""vLLM's prefix cache on a hybrid model (sliding-window layers beside full-attention ones, gpt-oss): the stale
sliding-window pages it keeps cached.

vLLM's hybrid allocator gives the sliding layers their own blocks from the one pool. As a sequence's
computation moves past a sliding block's window, the block is freed (`SlidingWindowManager`'s
`remove_skipped_blocks` -> `BlockPool.free_blocks`, vllm/v1/core/single_type_kv_cache_manager.py) to the tail
of the same free queue the full-attention blocks go to, hashed: a cached block like any other, evicted in
least-recently-freed order. A later hit on the prefix needs only the window's sliding blocks at its end, so the
stale ones are never hit again, but until evicted they hold pool pages: in steady state a hybrid model keeps
about sliding_layers / full_layers stale pages per cached full page (gpt-oss: 18 of 36 layers, one per one),
and its prefix capacity is about half the KV tokens vLLM reports.

`StaleSliding` stands in for them: per prefill chunk, the pages that left the window (times the layer ratio)
go into the node's prefix index as cached, evictable pages under their own namespace, never matched. Stale
pages of generated tokens (a few per request) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.engines.kvengine.core.namespaces import Namespace
from kvbench.sim.geometry import ModelGeometry

STALE_NAMESPACE = Namespace("stale-sliding-window")


@dataclass(slots=True)
class StaleSliding:
    window: int  # tokens a sliding layer attends
    ratio: float  # pool pages a stale sliding page holds per full-attention page (sliding / full layers)
    page_size: int
    pages_cached: int = 0  # stale pages put in the index so far
    _carry: float = 0.0
    _serial: int = 0

    @classmethod
    def of(cls, geometry: ModelGeometry, page_size: int) -> StaleSliding | None:
        """The stale-page model of `geometry` (None: not a hybrid model, nothing goes stale)."""
        if not geometry.sliding_layers or not geometry.full_layers or not geometry.sliding_window:
            return None
        return cls(geometry.sliding_window, geometry.sliding_layers / geometry.full_layers, page_size)

    def left_window(self, start: int, end: int) -> int:
        """Full pages that left the window while tokens [start, end) were computed."""

        def behind(t: int) -> int:
            return max(t - self.window, 0) // self.page_size

        return max(behind(end) - behind(start), 0)

    def cache(self, scheduler, tenant, pages: int, now: float) -> int:
        """Put the stale pages of `pages` pages that left the window into `scheduler`'s index (evicting cached
        pages for room as an allocation would; none where nothing can be evicted). Returns how many."""
        owed = self._carry + pages * self.ratio
        n = int(owed)
        self._carry = owed - n
        if n <= 0 or not scheduler.can_allocate(n, tenant, now):
            return 0
        index = scheduler.index
        ids = index.pool.allocate(n)
        tokens = np.arange(self._serial, self._serial + n * self.page_size, dtype=np.int64) % (2**31 - 1)
        self._serial += n * self.page_size
        index.insert(STALE_NAMESPACE, tokens.astype(np.int32), ids, tenant, now, adopt_at=0)
        self.pages_cached += n
        return n
