"""Tenant ledger: per-tenant device page quotas, the contention cap and premium reservations.

The ledger is pure policy: it holds each tenant's terms and, given current usage (pages charged to each
tenant: its cached pages in the prefix index plus its running sequences' own pages, which the caller
counts), says whether a tenant may take more pages and from whom pages should be evicted.

Victim order for a requester that needs pages (`eviction_plan`):
1. pages beyond a tenant's quota, LRU among all over-quota tenants;
2. under contention, the requester's own pages while it is above the cap (cap_fraction of the device tier),
   all of its excess, even beyond what the request needs, so the tenant comes back down to the cap;
3. LRU among every tenant whose pages may be taken: a premium tenant's pages are taken by others only
   above its reserved device pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.prefix_index import EvictResult, PrefixIndex


@dataclass(frozen=True, slots=True)
class TenantTerms:
    """quota_pages: pages beyond it are evicted first. reserved_device_pages > 0 makes a premium tenant."""

    quota_pages: int
    reserved_device_pages: int = 0

    def __post_init__(self) -> None:
        if self.quota_pages < 0 or self.reserved_device_pages < 0:
            raise ValueError("TenantTerms: quota_pages and reserved_device_pages must be >= 0")


@dataclass(frozen=True, slots=True)
class EvictionStep:
    """Evict up to `max_pages` from the LRU leaves charged to `tenants`. `enforce`: evict all of them even
    beyond what the requester needs (a tenant over the contention cap comes back down to it)."""

    tenants: frozenset[TenantId]
    max_pages: int
    enforce: bool = False


@dataclass(frozen=True, slots=True)
class TenantLedger:
    device_pages: int
    terms: Mapping[TenantId, TenantTerms] = field(default_factory=dict)
    cap_fraction: float = 0.5
    default_terms: TenantTerms | None = None  # None: unknown tenants get the whole device tier as quota

    def __post_init__(self) -> None:
        if not 0 < self.cap_fraction <= 1:
            raise ValueError(f"cap_fraction={self.cap_fraction}: must be in (0, 1], e.g. 0.5")
        reserved = sum(t.reserved_device_pages for t in self.terms.values())
        if reserved > self.device_pages:
            raise ValueError(f"terms: {reserved} reserved device pages exceed the tier's {self.device_pages}")

    def terms_of(self, tenant: TenantId) -> TenantTerms:
        return self.terms.get(tenant) or self.default_terms or TenantTerms(self.device_pages)

    @property
    def cap_pages(self) -> int:
        return int(self.device_pages * self.cap_fraction)

    @staticmethod
    def contended(usage: Mapping[TenantId, int], free_pages: int, need: int) -> bool:
        """Contention: the request does not fit in free pages and more than one tenant holds pages."""
        return need > free_pages and sum(1 for k in usage.values() if k > 0) > 1

    def may_hold(self, tenant: TenantId, pages_after: int, contended: bool) -> bool:
        """Whether `tenant` may hold `pages_after` device pages (the cap applies only under contention)."""
        return not contended or pages_after <= max(self.cap_pages, self.terms_of(tenant).reserved_device_pages)

    def eviction_plan(
        self, requester: TenantId, need: int, usage: Mapping[TenantId, int], evictable: Mapping[TenantId, int]
    ) -> tuple[EvictionStep, ...]:
        """Steps to free `need` pages for `requester`; run them in order until enough is freed."""
        steps: list[EvictionStep] = []
        over = {t: min(u - self.terms_of(t).quota_pages, evictable.get(t, 0)) for t, u in usage.items()}
        over = {t: k for t, k in over.items() if k > 0}
        # Over-quota pages: LRU across plain tenants (it may take a little past one tenant's excess);
        # a premium tenant is stepped alone, so its reservation can never be crossed.
        plain_over = {t: k for t, k in over.items() if not self.terms_of(t).reserved_device_pages}
        if plain_over:
            steps.append(EvictionStep(frozenset(plain_over), sum(plain_over.values())))
        for t in over.keys() - plain_over.keys():
            if t == requester:
                steps.append(EvictionStep(frozenset({t}), over[t]))
            else:
                over[t] = min(over[t], usage[t] - self.terms_of(t).reserved_device_pages)
                steps.append(EvictionStep(frozenset({t}), over[t]))
        own_excess = usage.get(requester, 0) + need - self.cap_pages
        if own_excess > 0 and self.contended(usage, 0, need):
            steps.append(EvictionStep(frozenset({requester}), min(own_excess, evictable.get(requester, 0)), True))
        free_for_all, limited = [], []
        for t, k in evictable.items():
            reserved = self.terms_of(t).reserved_device_pages
            if t == requester or reserved == 0:
                free_for_all.append(t)
            else:
                left = min(k, usage.get(t, 0) - reserved) - over.get(t, 0)
                limited.append(EvictionStep(frozenset({t}), left))
        if free_for_all:
            steps.append(EvictionStep(frozenset(free_for_all), need))
        steps.extend(limited)
        return tuple(s for s in steps if s.max_pages > 0)


def evict_for(
    index: PrefixIndex,
    ledger: TenantLedger,
    requester: TenantId,
    need: int,
    usage: Mapping[TenantId, int],
    now: float,
) -> dict[TenantId, int]:
    """Carry out `ledger.eviction_plan` on `index` until `need` pages are dropped. Returns pages per tenant."""
    evictable = {t: index.evictable_pages_of(t) for t in set(usage) | {requester}}
    taken: dict[TenantId, int] = {}
    left = need
    for step in ledger.eviction_plan(requester, need, usage, evictable):
        if left <= 0:
            break
        res: EvictResult = index.evict(
            step.max_pages if step.enforce else min(left, step.max_pages), now, tenants=step.tenants
        )
        left -= res.num_freed
        for t, k in res.by_tenant.items():
            taken[t] = taken.get(t, 0) + k
    return taken
