"""Lower KV tiers of the simulator (host memory, local disk, a shared remote store) as LMCache keeps them.

`BelowDevice` is the seam a simulated node drives at fixed points (arrival, install, each step, finish);
`WriteThroughTiers` (here: LMCache) and `TtlTiers` (ttl_tiers.py: our engine's TierPolicy) implement it.

Each tier is the core's own PagePool + PrefixIndex (radix tree, LRU over unlocked leaves), sized to the
tier's capacity in pages. LMCache-style policy: write-through (a finished request's computed pages are
stored in every lower tier, independently of the device cache) and lookup by longest prefix at admission.
The pool grows on demand up to its capacity, so a 30 TB disk costs memory only for what is stored.

Why not the core's TierPolicy: it places entries one tier at a time by TTL (our engine's design), whereas the
systems compared in the article (LMCache) keep copies in every tier they write to. The device tier never
appears here: the scheduler's prefix index is the device cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvbench.engines.kvengine.core.namespaces import Namespace, TenantId
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.tiers import Tier

_INITIAL_PAGES = 1024


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the tiers below device add to a prompt's cached prefix: tokens per tier, the device's own full
    pages at lookup (`start`), the full pages cached once restored (`pages`), and content keys (TTL tiers)."""

    tokens_by_tier: dict[Tier, int]
    start: int
    pages: int
    keys: tuple = ()


class BelowDevice(Protocol):
    """The tiers under the device cache, as a node drives them (every `now` is the node's virtual time)."""

    def lookup(
        self, index: PrefixIndex, namespace: Namespace, prompt: np.ndarray, limit: int, now: float
    ) -> Lookup | None:
        """At arrival: pages of the prompt's first `limit` pages beyond the device match held below, or None."""

    def install_upto(self, lookup: Lookup, device_pages: int) -> int:
        """At install (the device now holds `device_pages` of the prompt): full pages to have cached after it
        (0: restore nothing)."""

    def installed(self, lookup: Lookup, device_pages: int) -> None:
        """The restore reached device (the device held `device_pages` of the prompt just before)."""

    @property
    def passive(self) -> bool:
        """True when `maintain` and `sync` never do anything: a node may then run steps without calling them."""

    def maintain(self, index: PrefixIndex, now: float) -> None:
        """Before each step: placement by age (TTL tiers)."""

    def sync(self, now: float) -> None:
        """After anything that may evict device pages: where the dropped pages go."""

    @property
    def restores_at_admission(self) -> bool:
        """True: looked up when the node hands the request to its scheduler (vLLM's connectors); False: when
        the request arrives, its restore done before it queues."""

    @property
    def async_load(self) -> bool:
        """With `restores_at_admission`: True, the request waits for its load while other requests' steps run
        (vLLM's OffloadingConnector); False, the step that admits it waits (LMCache's retrieve)."""

    def computed(
        self, request_id: str, namespace: Namespace, tokens: np.ndarray, computed: int, tenant: TenantId, now: float
    ) -> None:
        """A step ended at `now` having computed `tokens[:computed]` of a prefilling request."""

    def held_pages(self, namespace: Namespace, prompt: np.ndarray, now: float) -> int:
        """Leading full pages of `prompt` the node's own tiers below device hold at `now` (what vLLM's KV
        events with a CPU medium tell a tier-aware router). A pure read."""

    def store(
        self,
        request_id: str,
        namespace: Namespace,
        prompt: np.ndarray,
        output: Sequence[int],
        tenant: TenantId,
        now: float,
    ) -> None:
        """A request finished (write-through tiers copy its KV: the prompt and every output token but the
        last, which the engine sampled but never computed KV for)."""


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
            adopted = index.insert(
                namespace, tokens[:end], list(match.pages) + pages, tenant, now, adopt_at=match.num_pages
            ).num_adopted
            pool.release(pages[adopted:])  # the index took over the references of the pages it adopted
            self.stored_pages += take
        index.unlock(match)


@dataclass(slots=True)
class WriteThroughTiers:
    """LMCache's way: every finished request's pages are written to each tier (copies, independent of the
    device cache); an arriving prompt restores its longest prefix from the fastest tier that has it. With no
    tiers, a device-only system (every method does nothing)."""

    tiers: tuple[LowerTier, ...] = ()  # fastest first; a shared remote tier is the same object on every node

    def lookup(
        self, index: PrefixIndex, namespace: Namespace, prompt: np.ndarray, limit: int, now: float
    ) -> Lookup | None:
        if not self.tiers:
            return None
        start = have = min(index.match(namespace, prompt).num_pages, limit)
        by_tier: dict[Tier, int] = {}
        for tier in self.tiers:
            n = min(tier.match_pages(namespace, prompt), limit)
            if n > have:
                by_tier[tier.tier] = (n - have) * index.page_size
                tier.touch(namespace, prompt[: n * index.page_size], now)
                have = n
        return Lookup(by_tier, start, have) if by_tier else None

    def install_upto(self, lookup: Lookup, device_pages: int) -> int:
        return lookup.pages  # copies below stay: pages the device lost meanwhile come back too

    def installed(self, lookup: Lookup, device_pages: int) -> None:
        return None

    @property
    def passive(self) -> bool:
        return True  # copies are written when a request finishes, never at a step's fixed points

    def maintain(self, index: PrefixIndex, now: float) -> None:
        return None

    def sync(self, now: float) -> None:
        return None

    restores_at_admission = False
    async_load = False

    def computed(
        self, request_id: str, namespace: Namespace, tokens: np.ndarray, computed: int, tenant: TenantId, now: float
    ) -> None:
        return None  # copies are written when a request finishes

    def held_pages(self, namespace: Namespace, prompt: np.ndarray, now: float) -> int:
        return max((t.match_pages(namespace, prompt) for t in self.tiers), default=0)

    def store(
        self,
        request_id: str,
        namespace: Namespace,
        prompt: np.ndarray,
        output: Sequence[int],
        tenant: TenantId,
        now: float,
    ) -> None:
        if not self.tiers:
            return
        tokens = np.concatenate([prompt, np.asarray(output[:-1], np.int32)])
        for tier in self.tiers:
            tier.store(namespace, tokens, tenant, now)
