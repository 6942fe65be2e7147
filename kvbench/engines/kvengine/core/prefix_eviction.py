"""The prefix index's eviction: unlocked leaves taken off the tree in LRU order, the index's references
released. `PrefixIndex` inherits it; the tree and its counters are the index's (`prefix_index`).

Candidates are kept in per-tenant heaps of (tick, node id, node); an entry goes stale when its node is used
again (its tick moves), locked, given children or dropped, and stale entries are skipped on pop. A node is
pushed whenever it may have become an unlocked leaf (`_push_if_leaf`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

from kvbench.engines.kvengine.core.events import EventKind, PageChange, PageRecord
from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.pages import IntegrityError, PageId
from kvbench.engines.kvengine.core.prefix_tree import DEVICE_TIER, Node


@dataclass(frozen=True, slots=True)
class EvictResult:
    num_pages: int  # pages dropped from the index
    num_freed: int  # of those, pages that went back to the pool (no other holder)
    by_tenant: dict[TenantId, int]


class Eviction:
    """`evict`, `evict_each` and `evict_idle` of PrefixIndex (whose fields they use; see its contracts)."""

    __slots__ = ()

    def _push_if_leaf(self, node: Node) -> None:
        if not node.children and node.lock_ref == 0 and node.parent is not None:
            heapq.heappush(self._heaps.setdefault(node.tenant, []), (node.tick, node.node_id, node))

    def evict(self, num_pages: int, now: float, tenants: Collection[TenantId] | None = None) -> EvictResult:
        """Drop up to `num_pages` pages, least recently used unlocked leaves first, deepest page first.

        With `tenants`, only leaves charged to those tenants are candidates (LRU among them).
        """
        if tenants is None:
            heaps = list(self._heaps.values())
        else:
            heaps = [self._heaps[t] for t in tenants if t in self._heaps]
        dropped = freed = 0
        by_tenant: dict[TenantId, int] = {}
        while dropped < num_pages:
            best = self._lru(heaps)
            if best is None:
                break
            k = min(num_pages - dropped, len(best[0][2].pages))
            t, tail = self._drop_tail(best, k)
            freed += self.pool.release(tail)
            dropped += k
            by_tenant[t] = by_tenant.get(t, 0) + k
        for t, k in by_tenant.items():
            self.events.record(EventKind.EVICTED, t, DEVICE_TIER, k, now)
        return EvictResult(num_pages=dropped, num_freed=freed, by_tenant=by_tenant)

    def evict_each(self, times: Sequence[float]) -> list[PageId]:
        """`evict(1, t)` for each of `times` in turn, each followed by the caller's `pool.allocate(1)`, which
        gets back the page just freed: the same pages in the same order, with the same events and journal
        records, as those calls (a decode run in a full pool: one page per new decode page). The index's
        references pass to the caller, so the pool itself does not change. Raises IntegrityError if fewer
        pages are evictable, or if a page would not be freed (another holder has it)."""
        heaps = list(self._heaps.values())
        taken: list[PageId] = []
        record = self.events.record
        for now in times:
            best = self._lru(heaps)
            if best is None:
                raise IntegrityError(f"evict_each: {len(times) - len(taken)} of {len(times)} pages not evictable")
            emptied = len(best[0][2].pages) == 1
            t, tail = self._drop_tail(best, 1)
            if self.pool.ref_count(tail[0]) != 1:
                raise IntegrityError(f"evict_each: page {tail[0]} dropped from the index has another holder")
            taken.append(tail[0])
            record(EventKind.EVICTED, t, DEVICE_TIER, 1, now)
            if emptied:  # its parent may have become a leaf of a tenant with no heap yet, as evict() would see
                heaps = list(self._heaps.values())
        return taken

    def _lru(self, heaps: list[list]) -> list | None:
        """The heap whose top is the least recently used valid leaf (stale tops popped), or None."""
        best = None
        for h in heaps:
            while h and not self._valid(h[0]):
                heapq.heappop(h)
            if h and (best is None or h[0] < best[0]):
                best = h
        return best

    def _drop_tail(self, heap: list, k: int) -> tuple[TenantId, list[PageId]]:
        """Take the last `k` pages off the leaf at the top of `heap` (the whole leaf if k is all of them),
        journaling them and updating the counters; the caller releases the index's references. Returns the
        leaf's tenant and the pages."""
        leaf: Node = heap[0][2]
        tail = leaf.pages[len(leaf.pages) - k :]
        if self._journaling:
            for key, page in zip(leaf.keys[len(leaf.keys) - k :], tail):
                self.journal.record_page(PageRecord(PageChange.DROPPED, key, page, leaf.tenant, leaf.last_access))
        if k == len(leaf.pages):
            pb = 4 * self.pool.page_size
            heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[bytes(leaf.key[:pb])]
            leaf.parent = None
            leaf.pages = []
            leaf.keys = []
            self._num_nodes -= 1
            self._push_if_leaf(parent)
        else:  # in place: copying a long leaf to drop one page made every decode step in a full pool O(leaf)
            del leaf.pages[len(leaf.pages) - k :]
            del leaf.keys[len(leaf.keys) - k :]
            del leaf.key[len(leaf.key) - k * 4 * self.pool.page_size :]
        t = leaf.tenant
        self._evictable -= k
        self._evictable_by_tenant[t] -= k
        self._pages_by_tenant[t] -= k
        return t, tail

    def evict_idle(self, now: float, ttl_of: Callable[[TenantId], float]) -> EvictResult:
        """Drop every unlocked page whose node was last used `ttl_of(its tenant)` seconds ago or earlier.

        A node is never used later than its parent, so idle pages form whole subtrees: leaves go first and
        their parents follow once they become leaves themselves."""
        dropped = freed = 0
        by_tenant: dict[TenantId, int] = {}
        progress = True
        while progress:
            progress = False
            for tenant, heap in list(self._heaps.items()):  # evicting may add a parent's tenant
                while heap and not self._valid(heap[0]):
                    heapq.heappop(heap)
                if heap and now - heap[0][2].last_access >= ttl_of(tenant):
                    result = self.evict(len(heap[0][2].pages), now, tenants=(tenant,))
                    dropped, freed = dropped + result.num_pages, freed + result.num_freed
                    by_tenant[tenant] = by_tenant.get(tenant, 0) + result.num_pages
                    progress = True
        return EvictResult(num_pages=dropped, num_freed=freed, by_tenant=by_tenant)

    @staticmethod
    def _valid(entry: tuple) -> bool:
        tick, _, node = entry
        return node.parent is not None and not node.children and node.lock_ref == 0 and node.tick == tick
