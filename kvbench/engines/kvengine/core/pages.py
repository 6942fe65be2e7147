"""Page pool: a fixed set of device pages with reference counts and an O(1) free list.

A page is `page_size` tokens of KV. Page 0 is the reserved null page (padding in page tables); it is never
handed out. Every holder of a page (the prefix index, a running sequence's own pages) owns one reference; a
sequence's pages borrowed from the index hold none, the index's lock keeps them (see the scheduler).
A page whose count drops to 0 goes back on the free list. Which cached pages are evicted, and when, is the
prefix index's decision (its LRU list of unlocked leaves); the pool only counts references.

State changes only in `allocate`, `share` and `release`; everything else is a read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType, Sequence

PageId = NewType("PageId", int)
NULL_PAGE = PageId(0)
DEFAULT_PAGE_SIZE = 16


class PoolExhausted(RuntimeError):
    """Raised by `allocate` when fewer pages are free than asked for; ask `can_allocate` first."""


class IntegrityError(AssertionError):
    """A broken invariant of a core data structure: a leak or a double free. Always a bug."""


@dataclass(slots=True)
class PagePool:
    """`num_pages` pages (including the null page) of `page_size` tokens each.

    Free pages are handed out lowest id first on a fresh pool; a released page is the next one reused (LIFO),
    so tests can predict page ids exactly.

    Reference counts are a plain list of ints: the pool is touched a few pages at a time (a decode step's new
    page, one evicted page), where numpy's per-call overhead cost more than the work, and a per-page Python
    loop stays faster than converting a page list to an array even for a whole long prompt.
    """

    num_pages: int
    page_size: int = DEFAULT_PAGE_SIZE
    _ref: list[int] = field(init=False, repr=False)
    # A stack: the next page handed out is _free[-1].
    _free: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_pages < 2:
            raise ValueError(f"num_pages={self.num_pages}: need at least 2 (page 0 is the reserved null page)")
        if self.page_size < 1:
            raise ValueError(f"page_size={self.page_size}: must be a positive number of tokens, e.g. 16")
        self._ref = [0] * self.num_pages
        self._ref[NULL_PAGE] = 1  # held forever, so it is never free and never handed out
        self._free = list(range(self.num_pages - 1, 0, -1))

    @property
    def capacity(self) -> int:
        """Usable pages (the null page excluded)."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[PageId]:
        """Take `n` free pages, each with reference count 1 owned by the caller."""
        if n < 0:
            raise ValueError(f"n={n}: cannot allocate a negative number of pages")
        if n > len(self._free):
            raise PoolExhausted(f"asked for {n} pages, {len(self._free)} free; call can_allocate first")
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        out.reverse()
        ref = self._ref
        for page in out:
            ref[page] = 1
        return out  # type: ignore[return-value]

    def share(self, pages: Sequence[PageId]) -> None:
        """Add one reference to each page (which must be in use): a second holder of the same KV."""
        ref = self._ref
        for done, page in enumerate(pages):
            if page == NULL_PAGE or ref[page] <= 0:
                for undo in pages[:done]:  # all or nothing
                    ref[undo] -= 1
                raise IntegrityError(f"share() of a free or null page among {list(pages)[:8]}...")
            ref[page] += 1

    def release(self, pages: Sequence[PageId]) -> int:
        """Drop one reference from each page; pages reaching 0 become free. Returns how many became free."""
        if not pages:
            return 0
        if NULL_PAGE in pages:
            raise IntegrityError("release() of the null page")
        ref, free = self._ref, self._free
        before = len(free)
        # Backwards, so that freed pages are pushed in reverse caller order and the caller's first page is
        # the next one reused; a page listed twice reaches 0 once, at its first listing.
        for done, page in enumerate(reversed(pages)):
            count = ref[page] - 1
            if count < 0:
                for undo in pages[len(pages) - done :]:  # all or nothing
                    ref[undo] += 1
                del free[before:]
                raise IntegrityError(f"release() would make a reference count negative among {list(pages)[:8]}")
            ref[page] = count
            if count == 0:
                free.append(page)
        return len(free) - before

    def grow(self, extra: int) -> None:
        """Add `extra` free pages (an unbounded cache in trace statistics; a tier that was resized)."""
        if extra < 0:
            raise ValueError(f"extra={extra}: a pool can only grow")
        self._ref.extend([0] * extra)
        self._free[:0] = range(self.num_pages + extra - 1, self.num_pages - 1, -1)
        self.num_pages += extra

    def ref_count(self, page: PageId) -> int:
        return self._ref[page]

    def check_integrity(self) -> None:
        """Raise IntegrityError unless: free pages have count 0 and appear once, all others count >= 1."""
        free, ref = self._free, self._ref
        if len(set(free)) != len(free):
            raise IntegrityError("a page is on the free list twice")
        if NULL_PAGE in free:
            raise IntegrityError("the null page is on the free list")
        if any(ref[page] != 0 for page in free):
            raise IntegrityError("a page is both free and referenced")
        if any(count < 0 for count in ref):
            raise IntegrityError("a negative reference count")
        used = sum(1 for count in ref[1:] if count > 0)
        if used + len(free) != self.capacity:
            raise IntegrityError(f"leak: {used} used + {len(free)} free != {self.capacity} pages")
