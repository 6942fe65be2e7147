"""Cache events collected in memory and drained by the metrics exporter (no logging inside data structures).

Producers (prefix index, tier policy) call `record`; a consumer calls `take_events()` now and then, which
returns everything since the last call and empties the log. `NullEventLog` drops everything (metrics off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class EventKind(str, Enum):
    STORED = "stored"  # pages newly inserted into the prefix index
    HIT = "hit"  # prompt pages found in the cache at admission
    EVICTED = "evicted"  # cached pages dropped
    MOVED = "moved"  # pages moved between tiers (the tier is the destination)


@dataclass(frozen=True, slots=True)
class CacheEvent:
    kind: EventKind
    tenant: str
    tier: str
    num_pages: int
    time: float


class EventSink(Protocol):
    def record(self, kind: EventKind, tenant: str, tier: str, num_pages: int, time: float) -> None: ...


@dataclass(slots=True)
class EventLog:
    """An in-memory list of events; `take_events()` drains it."""

    _events: list[CacheEvent] = field(default_factory=list)

    def record(self, kind: EventKind, tenant: str, tier: str, num_pages: int, time: float) -> None:
        if num_pages:
            self._events.append(CacheEvent(kind, tenant, tier, num_pages, time))

    def take_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events


@dataclass(slots=True)
class NullEventLog:
    """Metrics off: records nothing."""

    def record(self, kind: EventKind, tenant: str, tier: str, num_pages: int, time: float) -> None:
        return None

    def take_events(self) -> list[CacheEvent]:
        return []
