"""Tier policy: where each cached page should live (device, host, disk, remote) given age and pressure.

Entries are opaque keys chosen by the caller (the engine uses a stable id of a cached page's content) with a
tenant, a tier and a last-access time. `plan(now)` returns moves; the executor carries them out and
confirms each with `apply(move)` (ask-then-commit: nothing moves in the policy until applied). Time always
comes from the caller.

Rule: an entry used within its tenant's device TTL belongs on device, within the host TTL on host, older on
the slowest tier (disk, or remote when there is no disk). A tier over capacity pushes its least recently
used entries one tier down; the slowest tier drops them.

In the engine the device tier is the prefix index's (it evicts by LRU, the tenant ledger and `evict_idle`
with `device_ttl`); a page leaving it enters the policy at `tier_for_evicted`, and the policy then places it
among the lower tiers. Give the device tier capacity 0 there so that nothing is promoted back to device by
`plan`: restores to device happen on demand, at admission (`restore_plan`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum
from typing import Hashable, Iterable, Mapping

from kvbench.engines.kvengine.core.events import EventKind, EventSink, NullEventLog
from kvbench.engines.kvengine.core.namespaces import TenantId


class Tier(int, Enum):
    """Faster tiers have smaller values."""

    DEVICE = 0
    HOST = 1
    DISK = 2
    REMOTE = 3
    PEER = 4  # another replica's device cache, pulled over the network (the simulator's P2P tier; no policy)


class MoveKind(str, Enum):
    DEMOTE = "demote"
    PROMOTE = "promote"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class TierTTL:
    """Idle seconds before a page leaves device (`device_s`), then host (`host_s`)."""

    device_s: float = 30.0
    host_s: float = 600.0


DEFAULT_TTL = TierTTL()  # the engine's and the simulator's default, for tenants without TTLs of their own
DEFAULT_TIER_INTERVAL_S = 1.0  # how often (engine time) idle pages and tier capacities are acted on


@dataclass(frozen=True, slots=True)
class TierConfig:
    """capacities: pages per tier; a tier missing from it is not used. tenant_ttls override `default_ttl`."""

    capacities: Mapping[Tier, int]
    default_ttl: TierTTL = TierTTL()
    tenant_ttls: Mapping[TenantId, TierTTL] = field(default_factory=dict)
    _tiers: tuple[Tier, ...] = field(init=False, repr=False, compare=False, default=())  # sorted, fixed at init
    _on_host: Tier = field(init=False, repr=False, compare=False, default=Tier.HOST)

    def __post_init__(self) -> None:
        if Tier.DEVICE not in self.capacities:
            raise ValueError("capacities: the device tier is required, e.g. {Tier.DEVICE: 1024, Tier.HOST: 8192}")
        tiers = tuple(sorted(self.capacities))
        object.__setattr__(self, "_tiers", tiers)
        # Where a page whose age wants host goes: the fastest configured tier at least as slow (no host: disk).
        object.__setattr__(self, "_on_host", next((t for t in tiers if t >= Tier.HOST), tiers[-1]))

    @property
    def tiers(self) -> tuple[Tier, ...]:
        return self._tiers

    @property
    def on_host(self) -> Tier:
        return self._on_host


@dataclass(frozen=True, slots=True)
class Move:
    key: Hashable
    kind: MoveKind
    src: Tier
    dst: Tier | None  # None for DROP


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """How to bring a matched prefix back to device. `stages` run in order (disk -> host, then host ->
    device) so the executor can pipeline them; `keys` are the entries restorable in prefix order: it ends
    before the first entry the policy does not know (a miss)."""

    keys: tuple[Hashable, ...]
    stages: tuple[tuple[Tier, Tier, tuple[Hashable, ...]], ...]


@dataclass(slots=True)
class _Entry:
    tenant: TenantId
    tier: Tier
    last_access: float


@dataclass(slots=True)
class TierPolicy:
    """Where tracked pages should be. Besides the entries it keeps what lets `plan` answer "nothing to do"
    without visiting every entry: entries per tier, a heap of the times entries become due one tier down
    (stale items are skipped when popped), and the entries that may sit below their target tier."""

    config: TierConfig
    events: EventSink = field(default_factory=NullEventLog)
    _entries: dict[Hashable, _Entry] = field(default_factory=dict)
    _load: dict[Tier, int] = field(default_factory=dict)
    _due: list[tuple[float, int, Hashable]] = field(default_factory=list)
    _below_target: set[Hashable] = field(default_factory=set)
    _pushed: int = 0  # heap tie-breaker: keys need not be comparable

    def __post_init__(self) -> None:
        self._load = {t: 0 for t in self.config.tiers}

    def track(self, key: Hashable, tenant: TenantId, now: float, tier: Tier = Tier.DEVICE) -> None:
        """Start tracking a cached page (newly stored, normally on device)."""
        self.forget(key)
        self._entries[key] = e = _Entry(tenant, tier, now)
        self._load[tier] += 1
        self._note(key, e)

    def touch(self, key: Hashable, now: float) -> None:
        e = self._entries[key]
        e.last_access = now
        self._note(key, e)

    def forget(self, key: Hashable) -> None:
        e = self._entries.pop(key, None)
        if e is not None:
            self._load[e.tier] -= 1

    def _note(self, key: Hashable, e: _Entry) -> None:
        """Book `e` (new, touched or moved) for `plan`'s quick answer."""
        due = self._due_time(e)
        if due != float("inf"):
            self._pushed += 1
            heapq.heappush(self._due, (due, self._pushed, key))
        if e.tier > self.config.tiers[0]:  # a young page may want a faster tier than its own
            self._below_target.add(key)

    def _due_time(self, e: _Entry) -> float:
        """When `e`'s target becomes slower than its tier (inf: never). Targets only slow down with age."""
        ttl = self.config.tenant_ttls.get(e.tenant, self.config.default_ttl)
        if self.config.on_host > e.tier:
            return e.last_access + ttl.device_s
        return e.last_access + ttl.host_s if self.config.tiers[-1] > e.tier else float("inf")

    def device_ttl(self, tenant: TenantId) -> float:
        """Seconds a tenant's unused page stays on device (for `PrefixIndex.evict_idle`); infinite when there
        is no lower tier (an idle page is then kept until pressure evicts it, rather than lost)."""
        if len(self.config.tiers) == 1:
            return float("inf")
        return self.config.tenant_ttls.get(tenant, self.config.default_ttl).device_s

    def keys(self) -> list[Hashable]:
        """Every tracked key."""
        return list(self._entries)

    def tier_for_evicted(self, tenant: TenantId, last_access: float, now: float) -> Tier | None:
        """The lower tier a page dropped from device goes to (its TTL tier, at least host); None: none.

        Changes nothing: `track(key, tenant, last_access, tier)` once the page is written there."""
        want = self._target(_Entry(tenant, Tier.DEVICE, last_access), now)
        return next((t for t in self.config.tiers if t > Tier.DEVICE and t >= want), None)

    def usage_by_tenant(self) -> dict[tuple[TenantId, Tier], int]:
        """Entries per (tenant, tier)."""
        out: dict[tuple[TenantId, Tier], int] = {}
        for e in self._entries.values():
            out[(e.tenant, e.tier)] = out.get((e.tenant, e.tier), 0) + 1
        return out

    def tier_of(self, key: Hashable) -> Tier | None:
        e = self._entries.get(key)
        return None if e is None else e.tier

    def usage(self) -> dict[Tier, int]:
        out = {t: 0 for t in self.config.tiers}
        for e in self._entries.values():
            out[e.tier] += 1
        return out

    def _target(self, e: _Entry, now: float) -> Tier:
        """The configured tier `e`'s age asks for: device, host (or the next slower tier without one), slowest."""
        ttl = self.config.tenant_ttls.get(e.tenant, self.config.default_ttl)
        age = now - e.last_access
        return Tier.DEVICE if age < ttl.device_s else self.config.on_host if age < ttl.host_s else self.config.tiers[-1]

    def _settled(self, now: float) -> bool:
        """True only if `plan(now)` has no move: no tier over capacity, no entry due one tier down, no entry
        below its target tier where that tier has room. Conservative: False sends `plan` the full way."""
        capacities = self.config.capacities
        if any(n > capacities[t] for t, n in self._load.items()):
            return False
        while self._due:
            due, _, key = self._due[0]
            e = self._entries.get(key)
            if e is not None and self._due_time(e) == due:
                if due <= now + 1e-9 * max(1.0, abs(now)):  # rounding: let the full pass decide at the edge
                    return False
                break
            heapq.heappop(self._due)  # stale: the entry moved, was touched or forgotten since
        for key in list(self._below_target):
            e = self._entries.get(key)
            want = None if e is None else self._target(e, now)
            if want is None or want >= e.tier:
                self._below_target.discard(key)  # gone, or at or above its target for good (targets only slow)
            elif self._load[want] < capacities[want]:
                return False
        return True

    def plan(self, now: float) -> tuple[Move, ...]:
        """Moves that bring every entry to its TTL tier, then relieve tiers over capacity (LRU first).

        Promotions happen only into free room. Changes nothing: call `apply` for each move carried out."""
        return () if self._settled(now) else self._full_plan(now)

    def _full_plan(self, now: float) -> tuple[Move, ...]:
        """`plan` the long way: every entry's target, in LRU order (the reference for the quick answer)."""
        tiers = self.config.tiers
        targets = {k: self._target(e, now) for k, e in self._entries.items()}
        place = {k: e.tier for k, e in self._entries.items()}
        load = {t: 0 for t in tiers}
        for t in place.values():
            load[t] += 1
        moves: list[Move] = []
        # LRU order first so that, under pressure, the oldest go down first and the newest come up first.
        order = sorted(self._entries.items(), key=lambda kv: kv[1].last_access)
        for k, e in order:
            want = targets[k]
            if want > e.tier:
                moves.append(Move(k, MoveKind.DEMOTE, e.tier, want))
                load[e.tier] -= 1
                load[want] += 1
                place[k] = want
        for k, e in reversed(order):
            want = targets[k]
            if want < place[k] and load[want] < self.config.capacities[want]:
                moves.append(Move(k, MoveKind.PROMOTE, place[k], want))
                load[place[k]] -= 1
                load[want] += 1
                place[k] = want
        for i, tier in enumerate(tiers):
            excess = load[tier] - self.config.capacities[tier]
            for k, _ in order:
                if excess <= 0:
                    break
                if place[k] != tier:
                    continue
                below = tiers[i + 1] if i + 1 < len(tiers) else None
                moves.append(Move(k, MoveKind.DEMOTE if below is not None else MoveKind.DROP, tier, below))
                load[tier] -= 1
                if below is not None:
                    load[below] += 1
                place[k] = below  # type: ignore[assignment]
                excess -= 1
        return tuple(moves)

    def apply(self, move: Move, now: float) -> None:
        """Record that the executor carried out `move` (one page)."""
        e = self._entries.get(move.key)
        if e is None or e.tier != move.src:
            raise ValueError(f"move {move}: entry is not on {move.src.name}; plan again")
        if move.dst is None:
            self.forget(move.key)
            self.events.record(EventKind.EVICTED, e.tenant, move.src.name.lower(), 1, now)
        else:
            self._load[e.tier] -= 1
            e.tier = move.dst
            self._load[e.tier] += 1
            self._note(move.key, e)
            self.events.record(EventKind.MOVED, e.tenant, move.dst.name.lower(), 1, now)

    def restore_plan(self, keys: Iterable[Hashable]) -> RestorePlan:
        """Stages to bring `keys` (a matched prefix, in order) to device; stops at the first unknown key."""
        known: list[Hashable] = []
        for k in keys:
            if k not in self._entries:
                break
            known.append(k)
        by_tier: dict[Tier, list[Hashable]] = {}
        for k in known:
            by_tier.setdefault(self._entries[k].tier, []).append(k)
        stages: list[tuple[Tier, Tier, tuple[Hashable, ...]]] = []
        carried: list[Hashable] = []  # pages arriving on host from slower tiers, then forwarded to device
        for tier in sorted(by_tier, reverse=True):
            if tier >= Tier.DISK:
                stages.append((tier, Tier.HOST, tuple(by_tier[tier])))
                carried.extend(by_tier[tier])
        host = [k for k in known if k in set(carried) or self._entries[k].tier == Tier.HOST]
        if host:
            stages.append((Tier.HOST, Tier.DEVICE, tuple(host)))
        return RestorePlan(tuple(known), tuple(stages))
