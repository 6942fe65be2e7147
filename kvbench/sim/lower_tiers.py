"""Lower KV tiers of the simulator (host memory, local disk, a shared remote store) as LMCache keeps them.

Each tier is the core's own PagePool + PrefixIndex (radix tree, LRU over unlocked leaves), sized to the
tier's capacity in pages. LMCache-style policy: write-through (a finished request's computed pages are
stored in every lower tier, independently of the device cache) and lookup by longest prefix at admission.
The pool grows on demand up to its capacity, so a 30 TB disk costs memory only for what is stored.

Why not the core's TierPolicy: it places entries one tier at a time by TTL (our engine's design), whereas the
systems compared in the article (LMCache) keep copies in every tier they write to. The device tier never
appears here: the scheduler's prefix index is the device cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import Namespace, PrefixIndex, TenantId
from kvbench.engines.kvengine.core.tiers import Tier

_INITIAL_PAGES = 1024


@dataclass(slots=True)
class LowerTier:
    tier: Tier
    capacity_pages: int
    index: PrefixIndex
    stored_pages: int = 0  # pages written (write-through traffic)

    @classmethod
    def create(cls, tier: Tier, capacity_pages: int, page_size: int) -> LowerTier:
        if capacity_pages < 1:
            raise ValueError(f"{tier.name.lower()} tier: capacity_pages must be >= 1, got {capacity_pages}")
        pool = PagePool(1 + min(capacity_pages, _INITIAL_PAGES), page_size)
        return cls(tier, capacity_pages, PrefixIndex(pool))

    def match_pages(self, namespace: Namespace, tokens: np.ndarray) -> int:
        """Full pages of `tokens`' prefix this tier holds. A pure read."""
        return self.index.match(namespace, tokens).num_pages

    def touch(self, namespace: Namespace, tokens: np.ndarray, now: float) -> None:
        """Mark the matched prefix as used at `now` (a restore read it)."""
        match = self.index.match(namespace, tokens)
        self.index.lock(match, now)
        self.index.unlock(match)

    def store(self, namespace: Namespace, tokens: np.ndarray, tenant: TenantId, now: float) -> None:
        """Write the full pages of `tokens` (already-held pages are only touched), evicting LRU if full."""
        index, pool = self.index, self.index.pool
        match = index.match(namespace, tokens)
        need = len(tokens) // pool.page_size - match.num_pages
        index.lock(match, now)
        if need > pool.num_free:
            room = self.capacity_pages - pool.capacity
            if room > 0:
                pool.grow(min(room, max(need - pool.num_free, pool.capacity)))
            if need > pool.num_free:
                index.evict(need - pool.num_free, now)
        take = min(need, pool.num_free)  # a sequence longer than the whole tier keeps its head
        if take > 0:
            pages = pool.allocate(take)
            end = (match.num_pages + take) * pool.page_size
            index.insert(namespace, tokens[:end], list(match.pages) + pages, tenant, now)
            pool.release(pages)
            self.stored_pages += take
        index.unlock(match)
