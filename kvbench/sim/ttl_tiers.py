"""Our engine's own lower tiers in the simulator: the core's TierPolicy deciding, on a virtual clock.

This mirrors the decisions of `runtime/offload.py` (`OffloadExecutor`) without bytes:

    arrival       the prompt's pages beyond the device match are looked up by content key in the policy
                  (`restore_plan`); those found on host or disk are restored (timed by the cost model)
    install       restored pages enter the device cache; they leave host/disk (exclusive tiers)
    each step     pages the prefix index dropped go to `tier_for_evicted` (host within the tenant's host
                  TTL, else disk); once per `interval_s`: idle device pages leave by the tenant's device TTL
                  (`PrefixIndex.evict_idle`) and the policy's moves among host/disk are applied

The index must journal its pages (a `PageJournal`) and use this object's `key_salt`, so content keys are
those the engine would compute. Host and disk never refuse a page here (the engine's stores can fail).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.content_keys import page_keys
from kvbench.engines.kvengine.core.events import (
    EventKind,
    EventSink,
    NullEventLog,
    PageChange,
    PageJournal,
)
from kvbench.engines.kvengine.core.namespaces import Namespace, TenantId
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.tiers import DEFAULT_TIER_INTERVAL_S, Tier, TierConfig, TierPolicy, TierTTL
from kvbench.sim.lower_tiers import Lookup

SIM_KEY_SALT = "sim"


@dataclass(slots=True)
class TtlTiers:
    policy: TierPolicy
    journal: PageJournal
    events: EventSink = field(default_factory=NullEventLog)
    interval_s: float = DEFAULT_TIER_INTERVAL_S
    key_salt: str = SIM_KEY_SALT
    _last_maintenance: float | None = None

    @classmethod
    def create(
        cls,
        host_pages: int,
        disk_pages: int,
        ttl: TierTTL,
        tenant_ttls=None,
        interval_s: float = DEFAULT_TIER_INTERVAL_S,
        events: EventSink | None = None,
    ) -> TtlTiers:
        capacities = {Tier.DEVICE: 0}  # the device tier is the prefix index's (see core.tiers)
        if host_pages > 0:
            capacities[Tier.HOST] = host_pages
        if disk_pages > 0:
            capacities[Tier.DISK] = disk_pages
        if len(capacities) == 1:
            raise ValueError("ttl tiers: give a host or a disk capacity (pages > 0)")
        config = TierConfig(capacities, ttl, dict(tenant_ttls or {}))
        sink = events if events is not None else NullEventLog()
        return cls(TierPolicy(config, events=sink), PageJournal(), sink, interval_s)

    # ---- arrival and install -----------------------------------------------------------------------------
    def lookup(
        self, index: PrefixIndex, namespace: Namespace, prompt: np.ndarray, limit: int, now: float
    ) -> Lookup | None:
        """Pages of `prompt[: limit pages]` beyond the device match that host/disk hold, in prefix order."""
        start = index.match(namespace, prompt).num_pages
        if start >= limit:
            return None
        keys = page_keys(self.key_salt, namespace, prompt, index.page_size)[start:limit]
        plan = self.policy.restore_plan(keys)
        if not plan.keys:
            return None
        by_tier: dict[Tier, int] = {}
        for key in plan.keys:
            tier = self.policy.tier_of(key)
            by_tier[tier] = by_tier.get(tier, 0) + index.page_size
        return Lookup(by_tier, start, start + len(plan.keys), tuple(plan.keys))

    def install_upto(self, lookup: Lookup, device_pages: int) -> int:
        # As the engine: if the device lost part of the prefix since the lookup, the restore is dropped.
        return lookup.pages if device_pages >= lookup.start else 0

    def installed(self, lookup: Lookup, device_pages: int) -> None:
        """The restored pages reached device: they leave host/disk (exclusive tiers). Those that got there
        meanwhile another way were not read and stay where they are, as in the engine."""
        for key in lookup.keys[device_pages - lookup.start :]:
            self.policy.forget(key)

    restores_at_admission = False
    async_load = False

    def computed(
        self, request_id: str, namespace: Namespace, tokens: np.ndarray, computed: int, tenant: TenantId, now: float
    ) -> None:
        return None  # pages go down only when the device drops them (see `sync`)

    def store(
        self,
        request_id: str,
        namespace: Namespace,
        prompt: np.ndarray,
        output: Sequence[int],
        tenant: TenantId,
        now: float,
    ) -> None:
        return None

    def held_pages(self, namespace: Namespace, prompt: np.ndarray, now: float) -> int:
        return 0  # placed page by page by content key: no prefix to report (our engine emits no tier events)

    # ---- the step's fixed points -------------------------------------------------------------------------
    @property
    def passive(self) -> bool:
        return False  # evicted pages go down and idle pages leave at each step's fixed points

    def sync(self, now: float) -> None:
        """Pages the prefix index dropped go down to their TTL tier."""
        for record in self.journal.take_pages():
            if record.change != PageChange.DROPPED:
                continue
            tier = self.policy.tier_for_evicted(record.tenant, record.last_access, now)
            if tier is not None:
                self.policy.track(record.key, record.tenant, record.last_access, tier)
                self.events.record(EventKind.MOVED, record.tenant, tier.name.lower(), 1, now)

    def maintain(self, index: PrefixIndex, now: float) -> None:
        """At most once per `interval_s`: idle device pages leave by TTL, then host/disk placement moves."""
        if self._last_maintenance is not None and now - self._last_maintenance < self.interval_s:
            return
        self._last_maintenance = now
        index.evict_idle(now, self.policy.device_ttl)
        self.sync(now)
        for move in self.policy.plan(now):
            self.policy.apply(move, now)
