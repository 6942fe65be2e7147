"""A scheduled request's state in the scheduler: its tokens, its pages and how they are held.

Owned by `Scheduler` (which alone changes it); `CompactSteps` reads it for the simulator's fast paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.namespaces import Placement
from kvbench.engines.kvengine.core.pages import IntegrityError, PageId
from kvbench.engines.kvengine.core.plans import Request
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex, PromptMatch


@dataclass(slots=True, eq=False)
class Sequence:
    request: Request
    placement: Placement
    output: list[int] = field(default_factory=list)
    pages: list[PageId] = field(default_factory=list)
    match: PromptMatch | None = None
    num_computed: int = 0
    num_cached_tokens: int | None = None
    # Leading full pages already in the prefix index and locked through `match`: at least `borrowed`
    indexed_pages: int = 0
    swapped_pages: int = 0  # > 0 while swapped out to host
    # Leading pages whose one reference is the prefix index's, not the sequence's: the cached pages it matched
    # at admission and the pages it cached itself since (adopted: `insert`'s `adopt_at`). They stay locked
    # through `match` until `_release`, so nothing can free them under it; a second reference on each, taken
    # and dropped again at the finish, was a third of a long simulation's time.
    borrowed: int = 0
    _table: tuple[PageId, ...] | None = None  # `pages` as a tuple, rebuilt only after `pages` changes

    def page_table(self) -> tuple[PageId, ...]:
        """The page ids as an immutable tuple; cached, because a decode step adds a page only every page_size
        tokens and copying long tables every step dominated long simulations."""
        if self._table is None or len(self._table) != len(self.pages):  # `pages` only grows between resets
            self._table = tuple(self.pages)
        return self._table

    @property
    def length(self) -> int:
        return len(self.request.prompt) + len(self.output)

    @property
    def room(self) -> int:
        """Tokens it may still sample: the one that reaches max_new_tokens finishes it (see `_sampled`)."""
        return self.request.max_new_tokens - len(self.output)

    def tokens(self) -> np.ndarray:
        return np.concatenate([np.asarray(self.request.prompt, np.int32), np.asarray(self.output, np.int32)])


def check_holders(index: PrefixIndex, running: Iterable[Sequence], parked: Iterable[Sequence]) -> None:
    """IntegrityError unless every page's reference count is its number of holders (see
    `Scheduler.check_integrity`); a parked sequence holds no device page."""
    index.check_integrity()
    pool = index.pool
    pool.check_integrity()
    holders = dict.fromkeys(index.cached_page_ids(), 1)
    evictable = set(index.evictable_page_ids())
    parked_pages = [s.request.request_id for s in parked if s.pages]
    if parked_pages:
        raise IntegrityError(f"parked sequences {parked_pages[:8]} hold device pages")
    for seq in running:
        missing = [p for p in seq.pages[: seq.borrowed] if p not in holders]
        if missing:
            raise IntegrityError(f"{seq.request.request_id}: borrowed pages {missing[:8]} are not cached")
        unlocked = [p for p in seq.pages if p in evictable]
        if unlocked:
            raise IntegrityError(
                f"{seq.request.request_id}: its pages {unlocked[:8]} are cached unlocked (evictable while it runs)"
            )
        for p in seq.pages[seq.borrowed :]:
            holders[p] = holders.get(p, 0) + 1
    wrong = [(p, pool.ref_count(p), n) for p, n in holders.items() if pool.ref_count(p) != n]
    in_use = pool.capacity - pool.num_free
    if wrong or in_use != len(holders):
        raise IntegrityError(
            f"reference counts (page, count, holders) {wrong[:8]}; {in_use} pages in use, {len(holders)} held"
        )
