"""The offload executor: carries out the pure core's tier decisions on real bytes, beside the step loop.

The step loop calls it at fixed points (nothing else moves KV between tiers):

    ready = offload.begin_step(now)   # restores whose stage 1 finished: written to device, requests admitted;
                                      # idle device pages (TTL) demoted; the tier policy's moves carried out
    plan = scheduler.schedule(now)
    offload.sync_pages(now)           # pages the schedule evicted: copied down before their ids are reused
    ... run the model, postprocess ...
    offload.sync_pages(now)           # pages just stored: published to the shared remote tier
    offload.end_step()                # the step's demotions are in their tiers (policy and events updated)

Demotions leave the step thread: `sync_pages` only gathers the pages' bytes (they must be copied before the
step overwrites their ids; on CUDA the copy to host runs on a side stream, so the forward does not wait for
it) and hands them to a demotion worker, which writes them into their tier (host slab, disk file) while the
model runs; `end_step` then records them in the tier policy on the step thread (the pure core is not
thread-safe). Publishing to the shared remote tier needs no record: it finishes whenever it does.

Decisions come from the core: which device pages are idle (`PrefixIndex.evict_idle` with the policy's
per-tenant device TTL), where an evicted page goes (`TierPolicy.tier_for_evicted`), host/disk placement and
capacity (`TierPolicy.plan`), what to restore (`TierPolicy.restore_plan`, then the remote tier for the rest).

A restore is a two-stage pipeline: stage 1 (disk / Redis -> host) runs on a worker thread while the engine
computes other requests; stage 2 (host -> device) runs on the step thread in `begin_step`, which then hands
the request to the scheduler, whose admission finds the restored pages in the prefix index. Pages move
up (exclusive tiers): a restored page leaves host/disk; the remote tier is shared and keeps its copy.
A page that cannot be read or verified ends the restore there: the rest of the prompt is recomputed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
import torch

from kvbench.engines.kvengine.core.adoption import adopt_pages
from kvbench.engines.kvengine.core.content_keys import PageKey
from kvbench.engines.kvengine.core.events import EventKind, EventLog, PageChange, PageJournal, PageRecord
from kvbench.engines.kvengine.core.pages import PageId
from kvbench.engines.kvengine.core.prefix_index import DEVICE_TIER, PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Request, Scheduler
from kvbench.engines.kvengine.core.tiers import (
    DEFAULT_TIER_INTERVAL_S,
    Move,
    MoveKind,
    Tier,
    TierPolicy,
)
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.runtime.tier_stores import DiskStore, HostStore, RedisStore, StoreFailure

REMOTE_TIER = "remote"
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Admission:
    """A request ready for the scheduler; `page_tiers[i]` names the tier prompt page i came from (device
    for pages already there), for the per-tier cached-token counts of its usage."""

    request: Request
    page_tiers: tuple[str, ...] = ()


@dataclass(slots=True)
class _Restore:
    request: Request
    keys: list[PageKey]  # the pages to restore, in prompt order, after the device match
    start: int  # device-matched pages when the restore began
    sources: list[str]  # tier name per key (remote ones appended by stage 1)
    rows: Future  # stage 1: list of host rows (uint8 tensors), cut at the first miss


@dataclass(slots=True)
class OffloadExecutor:
    kv_cache: PagedKVCache
    scheduler: Scheduler
    policy: TierPolicy
    journal: PageJournal
    events: EventLog
    key_salt: str
    host: HostStore | None = None
    disk: DiskStore | None = None
    remote: RedisStore | None = None
    maintenance_interval_s: float = DEFAULT_TIER_INTERVAL_S
    _restores: list[_Restore] = field(default_factory=list)
    _workers: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(2, "kvengine-restore"))
    _demoter: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "kvengine-demote"))
    _demotions: list[tuple[Future, float]] = field(default_factory=list)  # (-> [(record, tier, stored?)], now)
    _publishes: list[Future] = field(default_factory=list)
    _copy_stream: object = None  # a torch.cuda.Stream for device -> host copies, made on first use
    _last_maintenance: float | None = None

    @property
    def index(self) -> PrefixIndex:
        return self.scheduler.index

    @property
    def num_restoring(self) -> int:
        return len(self._restores)

    def _store(self, tier: Tier):
        return {Tier.HOST: self.host, Tier.DISK: self.disk}[tier]

    def failures(self) -> list[StoreFailure]:
        """Tier failures since the last call (full disk, Redis down, corrupt pages), drained."""
        out: list[StoreFailure] = []
        for store in (self.host, self.disk, self.remote):
            if store is not None:
                out.extend(store.failures)
                store.failures.clear()
        return out

    # ---- admission: start a restore ----------------------------------------------------------------------
    def submit(self, request: Request, now: float) -> Admission | None:
        """An Admission if nothing below device can extend the request's cached prefix; else None, and
        stage 1 of a restore starts (the request comes back from `begin_step` once its pages are on device)."""
        self.end_step()  # pages demoted by the last step are findable in their tier
        if not (request.use_cached_prefix and self.scheduler.config.prefix_caching):
            return Admission(request)
        placement = self.scheduler.placement(request)
        ps = self.index.page_size
        limit = (len(request.prompt) - 1) // ps  # the scheduler always computes the last prompt token
        start = self.index.match_prompt(placement, request.prompt).num_pages
        if start >= limit:
            return Admission(request, (DEVICE_TIER,) * start)
        keys = placement.page_keys(self.key_salt, request.prompt, ps)[start:limit]
        plan = self.policy.restore_plan(keys)
        sources = [self.policy.tier_of(k).name.lower() for k in plan.keys]
        if not plan.keys and self.remote is None:
            return Admission(request, (DEVICE_TIER,) * start)
        host_rows = {
            k: self.host.get_tensor(k)
            for k in plan.keys
            if self.host is not None and self.policy.tier_of(k) == Tier.HOST
        }
        rows = self._workers.submit(self._stage1, keys, sources, host_rows)
        self._restores.append(_Restore(request, keys, start, sources, rows))
        return None

    def _stage1(self, keys: list[PageKey], sources: list[str], host_rows: dict) -> list[torch.Tensor]:
        """Worker thread: bring every page to host, in prompt order, up to the first miss."""
        rows: list[torch.Tensor] = []
        for key, source in zip(keys, sources):
            if source == "host":
                row = host_rows.get(key)
            else:
                payload = self.disk.get(key) if self.disk is not None else None
                row = None if payload is None else _row(payload)
            if row is None:
                return rows
            rows.append(row)
        rest = keys[len(sources) :]
        if self.remote is not None and rest:
            for payload in self.remote.get_many(list(rest)):
                if payload is None:
                    break
                rows.append(_row(payload))
                sources.append(REMOTE_TIER)
        return rows

    # ---- the step's fixed points -------------------------------------------------------------------------
    def begin_step(self, now: float, wait_s: float = 0.0) -> list[Admission]:
        """Finish restores whose stage 1 is done (waiting up to `wait_s` for one when asked), then keep the
        tiers in order. Returns the requests to hand to the scheduler."""
        self.end_step()
        if wait_s and self._restores and not any(r.rows.done() for r in self._restores):
            self._restores[0].rows.exception(timeout=wait_s)
        ready = [r for r in self._restores if r.rows.done()]
        self._restores = [r for r in self._restores if not r.rows.done()]
        admitted = [self._stage2(r, now) for r in ready]
        self._maintain(now)
        return admitted

    def _stage2(self, job: _Restore, now: float) -> Admission:
        """Adopt the rows stage 1 read (prompt pages job.start..) as device pages; the ones that reached device
        meanwhile another way (another request's) are skipped."""
        request, rows = job.request, job.rows.result()
        num_read = len(rows)

        def write(first: int, pages: Sequence[PageId]) -> None:
            self.sync_pages(now)  # pages evicted to make room: copied down before they are overwritten
            data = torch.stack(rows[first - job.start :])
            if self.kv_cache.device.type == "cuda":  # pinned: the copy up runs without blocking the step thread
                data = data.pin_memory()
            self.kv_cache.write_pages(list(pages), data)

        end = (job.start + num_read) * self.index.page_size
        adoption = adopt_pages(
            self.scheduler,
            self.scheduler.placement(request),
            request.prompt[:end],
            request.tenant,
            now,
            first_page=job.start,
            fill=write,
        )
        tiers = (DEVICE_TIER,) * adoption.matched_pages
        if adoption.no_room:
            return Admission(request, tiers)
        if adoption.pages:
            skip = adoption.matched_pages - job.start
            for key in job.keys[skip:num_read]:  # moved up: exclusive local tiers drop their copy
                self._forget(key)
            tiers += tuple(job.sources[skip:num_read])
        self._forget_failed(job, num_read)
        return Admission(request, tiers)

    def _forget(self, key: PageKey) -> None:
        tier = self.policy.tier_of(key)
        if tier is not None:
            self.policy.forget(key)
            self._store(tier).delete(key)

    def _forget_failed(self, job: _Restore, num_read: int) -> None:
        """The page after the last one read failed to read or verify: forget it, so it is recomputed."""
        if num_read < len(job.sources):
            self._forget(job.keys[num_read])

    def cancel(self, request: Request) -> bool:
        """Drop a request whose restore is in flight (the client left). True if it was here."""
        before = len(self._restores)
        self._restores = [r for r in self._restores if r.request.request_id != request.request_id]
        return len(self._restores) < before

    def holds(self, request_id: str) -> Request | None:
        return next((r.request for r in self._restores if r.request.request_id == request_id), None)

    def sync_pages(self, now: float) -> None:
        """Copy pages the prefix index dropped to their lower tier; publish stored pages to the remote tier.

        Returns once the pages' bytes are gathered (their ids may be reused right after); the writes into the
        tiers run on the demotion worker (`end_step` records them)."""
        records = self.journal.take_pages()
        dropped = [
            (r, t)
            for r in records
            if r.change == PageChange.DROPPED
            and (t := self.policy.tier_for_evicted(r.tenant, r.last_access, now)) is not None
        ]
        stored = [r for r in records if r.change == PageChange.STORED] if self.remote is not None else []
        if not dropped and not stored:
            return
        data, ready = self._copy_to_host([r.page for r, _ in dropped] + [r.page for r in stored])
        if dropped:
            self._demotions.append((self._demoter.submit(self._put_down, dropped, data, ready), now))
        if stored:
            self._publishes.append(self._demoter.submit(self._publish, stored, data, len(dropped), ready))

    def _copy_to_host(self, pages: list[PageId]) -> tuple[torch.Tensor, Callable[[], None]]:
        """The pages' rows on host, and a wait for the copy. The gather runs on the step's stream (so it reads
        the pages before this step overwrites them); on CUDA the copy to pinned host memory runs on a side
        stream, overlapping the step, and the worker waits for its event."""
        rows = self.kv_cache.read_pages(pages)
        if rows.device.type != "cuda":
            return rows, lambda: None
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(rows.device)
        stream = self._copy_stream
        stream.wait_stream(torch.cuda.current_stream(rows.device))
        host = torch.empty(rows.shape, dtype=torch.uint8, pin_memory=True)  # cached by torch's host allocator
        with torch.cuda.stream(stream):
            host.copy_(rows, non_blocking=True)
            rows.record_stream(stream)
            done = torch.cuda.Event()
            done.record(stream)
        return host, done.synchronize

    def _put_down(
        self, dropped: list[tuple[PageRecord, Tier]], data: torch.Tensor, ready: Callable[[], None]
    ) -> list[tuple[PageRecord, Tier, bool]]:
        """Demotion worker: write each dropped page into its tier."""
        ready()
        out = []
        for i, (record, tier) in enumerate(dropped):
            store, row = self._store(tier), data[i]
            ok = (
                store.put_tensor(record.key, row) if tier == Tier.HOST else store.put(record.key, row.numpy().tobytes())
            )
            out.append((record, tier, ok))
        return out

    def _publish(self, stored: list[PageRecord], data: torch.Tensor, first: int, ready: Callable[[], None]) -> None:
        ready()
        for i, record in enumerate(stored, start=first):
            self.remote.put(record.key, data[i].numpy().tobytes())

    def end_step(self) -> None:
        """Wait for the demotions handed to the worker and record them in the tier policy and the events."""
        demotions, self._demotions = self._demotions, []
        for job, now in demotions:
            for record, tier, ok in job.result():
                if ok:
                    self.policy.track(record.key, record.tenant, record.last_access, tier)
                    self.events.record(EventKind.MOVED, record.tenant, tier.name.lower(), 1, now)
                else:
                    self.events.record(EventKind.EVICTED, record.tenant, tier.name.lower(), 1, now)
        self._publishes = [job for job in self._publishes if not job.done()]

    def _maintain(self, now: float) -> None:
        """Demote idle device pages (per-tenant device TTL) and carry out the policy's moves among the lower
        tiers, at most once per `maintenance_interval_s` of engine time."""
        if self._last_maintenance is not None and now - self._last_maintenance < self.maintenance_interval_s:
            return
        self._last_maintenance = now
        self.index.evict_idle(now, self.policy.device_ttl)
        self.sync_pages(now)
        self.end_step()  # the plan below must see the pages just demoted
        for move in self.policy.plan(now):
            self._carry_out(move, now)

    def _carry_out(self, move: Move, now: float) -> None:
        src = self._store(move.src)
        if move.kind != MoveKind.DROP:
            payload = src.get(move.key)
            dst = self._store(move.dst)
            if payload is not None and dst.put(move.key, payload):
                self.policy.apply(move, now)
                src.delete(move.key)
                return
            move = Move(move.key, MoveKind.DROP, move.src, None)  # unreadable, or the lower tier refused
        self.policy.apply(move, now)
        src.delete(move.key)

    # ---- whole-cache operations --------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every lower-tier page (a prefix cache reset); waits for restores in flight."""
        for job in self._restores:
            job.rows.exception()
        self.end_step()
        wait(self._publishes)
        self.journal.take_pages()
        for key in self.policy.keys():
            self._forget(key)
        if self.remote is not None:
            self.remote.clear()

    def pages_by_tenant(self) -> dict[tuple[str, str], int]:
        """Pages per (tenant, tier name) in the local lower tiers."""
        return {(t, tier.name.lower()): n for (t, tier), n in self.policy.usage_by_tenant().items()}

    def close(self) -> None:
        self._workers.shutdown(wait=True, cancel_futures=True)
        self._demoter.shutdown(wait=True)


def _row(payload: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(payload, dtype=np.uint8).copy())
