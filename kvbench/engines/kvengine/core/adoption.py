"""Adoption of restored pages: KV brought back from a lower tier becomes cached device pages.

A restore (the engine's offload executor, the simulator's node) holds the KV of a prompt's pages from some
page on. To cache them, the device's part of the prefix is matched and locked (so that making room cannot
evict it), pages are asked for and allocated (evicting by the scheduler's policy), the caller fills them,
the prefix index takes them, and the caller's references and lock go:

    pages of `tokens`   | on device (matched) | restored: allocated, filled, inserted |
                        0                matched_pages                     len(tokens) // page_size

What changes state: the pool (pages allocated, then released to the index's own references), the prefix
index (the restored pages inserted after the match, LRU recency of the match) and, to make room, whatever
`Scheduler.can_allocate` evicts. Nothing changes when the device lacks part of the prefix before
`first_page` (the restore no longer connects) or already holds every page. Pure: no torch, no I/O; bytes are
the caller's `fill`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.engines.kvengine.core.namespaces import Placement, TenantId
from kvbench.engines.kvengine.core.pages import PageId
from kvbench.engines.kvengine.core.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class Adoption:
    """What `adopt_pages` did. The device held `matched_pages` full pages of the tokens before; `pages` now
    hold restored pages matched_pages.. in prompt order (empty: nothing adopted). `no_room`: there were pages
    to adopt but the pool could not make room for them, even by evicting."""

    matched_pages: int
    pages: tuple[PageId, ...] = ()
    no_room: bool = False


def adopt_pages(
    scheduler: Scheduler,
    placement: Placement,
    tokens: np.ndarray,
    tenant: TenantId,
    now: float,
    *,
    first_page: int = 0,
    fill: Callable[[int, Sequence[PageId]], None] | None = None,
) -> Adoption:
    """Cache the full pages of `tokens` that the device lacks, restored by the caller from page `first_page` on.

    `fill(first, pages)` is called once the pages are allocated and before the index takes them: write the
    KV of prompt page `first + i` into `pages[i]` (the engine copies evicted pages down first, then writes).
    If it raises, the pages go back to the pool and the lock is released."""
    index = scheduler.index
    match = index.match_prompt(placement, tokens)
    matched, total = match.num_pages, len(tokens) // index.page_size
    if matched < first_page or matched >= total:
        return Adoption(matched)
    index.lock_prompt(match, now)  # keep the device's part while room is made for the rest
    try:
        if not scheduler.can_allocate(total - matched, tenant, now):
            return Adoption(matched, no_room=True)
        pages = index.pool.allocate(total - matched)
        adopted = 0
        try:
            if fill is not None:
                fill(matched, pages)
            adopted = index.insert_prompt(
                placement, tokens, list(match.pages) + pages, tenant, now, adopt_at=matched
            ).num_adopted
        finally:
            index.pool.release(pages[adopted:])  # the index took over the references of the pages it adopted
    finally:
        index.unlock_prompt(match)
    return Adoption(matched, tuple(pages))
