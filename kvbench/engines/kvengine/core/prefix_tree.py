"""The prefix index's tree: its nodes and what its reads and inserts return (`prefix_index` owns the tree,
`prefix_eviction` takes leaves off it).

A Node is one edge of a radix tree: whole pages of token ids (as int32 bytes) and their page ids. Only the
index creates and edits nodes; a caller holds one only inside a PrefixMatch, to hand it back to `lock`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.content_keys import PageKey
from kvbench.engines.kvengine.core.namespaces import Namespace, TenantId
from kvbench.engines.kvengine.core.pages import PageId

DEVICE_TIER = "device"  # the tier name of the index's events


@dataclass(slots=True, eq=False)
class Node:
    node_id: int
    parent: Node | None
    # int32 token ids of this edge, whole pages. A bytearray so that eviction trims a long leaf's tail in place
    # (one page at a time in a full pool); its parent holds it under bytes(key[:page bytes]).
    key: bytearray
    pages: list[PageId]
    tenant: TenantId
    keys: list[PageKey]  # content key per page; a root holds one: its namespace's chain root
    children: dict[bytes, Node] = field(default_factory=dict)
    lock_ref: int = 0
    tick: int = 0  # LRU recency: larger = used more recently
    last_access: float = 0.0


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The cached full-page prefix of a prompt. `pages` are in prompt order."""

    namespace: Namespace
    pages: tuple[PageId, ...]
    page_size: int
    _node: Node | None = field(default=None, repr=False, compare=False)

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def num_tokens(self) -> int:
        return len(self.pages) * self.page_size


@dataclass(frozen=True, slots=True)
class PromptMatch:
    """The cached full-page prefix of a prompt across the parts of its placement; `pages` in prompt order.
    Valid, like its parts, until the next `insert` or `evict` unless locked (`lock_prompt`)."""

    parts: tuple[PrefixMatch, ...] = ()

    @property
    def pages(self) -> tuple[PageId, ...]:
        if len(self.parts) == 1:  # strict isolation: one part, no copy
            return self.parts[0].pages
        return tuple(page for part in self.parts for page in part.pages)

    @property
    def num_pages(self) -> int:
        return sum(part.num_pages for part in self.parts)


@dataclass(frozen=True, slots=True)
class InsertResult:
    num_pages: int  # full pages in the inserted tokens
    num_cached: int  # of those, already in the index (the caller's copies were not adopted)
    # The inserted tokens as `match` (one per namespace part, as `match_prompt`'s parts) would find them now:
    # what a caller that locks what it inserted needs, without walking the tree again.
    matches: tuple[PrefixMatch, ...] = ()
    # Adopted pages whose reference the index took over from the caller instead of taking its own (`adopt_at`)
    num_adopted: int = 0

    @property
    def num_new(self) -> int:
        return self.num_pages - self.num_cached


def token_bytes(tokens: np.ndarray, num_pages: int, page_size: int) -> bytes:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens: expected a 1-D array of token ids, got shape {arr.shape}")
    return arr[: num_pages * page_size].astype(np.int32, copy=False).tobytes()


def common_pages(a: bytes, b: bytes, page_bytes: int) -> int:
    """How many leading whole pages two byte strings share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.frombuffer(a, np.uint8, n) != np.frombuffer(b, np.uint8, n))
    return (int(diff[0]) if len(diff) else n) // page_bytes
