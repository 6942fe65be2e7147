"""Cache events collected in memory and drained by the metrics exporter (no logging inside data structures).

Producers (prefix index, tier policy) call `record`; a consumer calls `take_events()` now and then, which
returns everything since the last call and empties the log. `NullEventLog` drops everything (metrics off).

`PageJournal` is the same idea for the offload executor: which pages (id and content key) the prefix index
stored and dropped since the last `take_pages()`. A dropped page's bytes stay intact until the page is
written again, so the executor copies them out right after the call that dropped them (before the model
runs). `NullPageJournal` (the default) keeps nothing: the simulator and trace replay have no lower tiers.
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


class PageChange(str, Enum):
    STORED = "stored"  # a page entered the prefix index (its KV is on device)
    DROPPED = "dropped"  # a page left the prefix index (evicted); its page id may be reused after this step


@dataclass(frozen=True, slots=True)
class PageRecord:
    change: PageChange
    key: str  # content key (see content_keys)
    page: int  # device page id
    tenant: str
    last_access: float


class PageSink(Protocol):
    def record_page(self, record: PageRecord) -> None: ...


@dataclass(slots=True)
class PageJournal:
    """Stored and dropped pages in order; `take_pages()` drains it."""

    _records: list[PageRecord] = field(default_factory=list)

    def record_page(self, record: PageRecord) -> None:
        self._records.append(record)

    def take_pages(self) -> list[PageRecord]:
        records, self._records = self._records, []
        return records


@dataclass(slots=True)
class NullPageJournal:
    """No lower tiers: keeps nothing."""

    def record_page(self, record: PageRecord) -> None:
        return None

    def take_pages(self) -> list[PageRecord]:
        return []
