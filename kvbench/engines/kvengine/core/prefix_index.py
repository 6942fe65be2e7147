"""Prefix index: a radix tree over page-aligned token ids, one tree per namespace, owning cached pages.
Its nodes and results are in `prefix_tree`, its eviction (`evict`, `evict_each`, `evict_idle`) in
`prefix_eviction`, its integrity check in `prefix_audit`; this module owns the tree: match, lock, insert.

Mechanics follow SGLang's radix cache: an edge holds whole pages (its token ids and their page ids),
children are keyed by their first page's tokens, lock references are walked to the root, and eviction takes
unlocked leaves in LRU order. Unlike SGLang the tree owns no allocator and edits no request: it holds one
pool reference per cached page and releases it on eviction.

Namespaces (`namespaces`): every tree lives under a namespace key, so no match crosses namespaces; a
prompt's pages may span two of them (a `Placement`: a declared shared prefix, then the tenant's own). The
`*_prompt` methods (match / lock / unlock / insert) work across a placement's parts.

Contracts (what changes state, when a result is safe to use):
- `match` is a pure read. Its PrefixMatch is valid until the next `insert` or `evict`; `lock` it first to
  keep its pages (and their order) alive across those calls, until the matching `unlock`.
- `lock`/`unlock` change only lock counts and LRU recency; a locked node (and every ancestor) is never
  evicted. A lock covers the whole last node even when the match ended inside it.
- `insert` adds the pages past the already-cached prefix: the index takes its own pool reference to each
  page it adopts. The caller keeps its references and releases them when done (all of them: the tree holds
  its own). `InsertResult.num_cached` pages of the caller were duplicates and are not adopted. With
  `adopt_at`, the index instead takes over the caller's own references when the new pages begin at that page
  (`InsertResult.num_adopted`): the caller no longer holds them, and keeps them alive only by a lock.
- `evict` drops the tail pages of the least recently used unlocked leaves, releasing the index's references.
  `evict_idle` drops, leaf by leaf, every unlocked page unused for longer than its tenant's device TTL.

Content keys: every cached page has a content key (`content_keys`: a hash chain of its namespace, the
index's `key_salt` and the token ids up to it). The `journal` hears of every page stored and dropped, with
its key, so that an offload executor can copy dropped pages to a lower tier before their ids are reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from kvbench.engines.kvengine.core.content_keys import PageKey, chain_keys, root_key
from kvbench.engines.kvengine.core.events import (
    EventKind,
    EventSink,
    NullEventLog,
    NullPageJournal,
    PageChange,
    PageRecord,
    PageSink,
)
from kvbench.engines.kvengine.core.namespaces import Namespace, Placement, TenantId
from kvbench.engines.kvengine.core.pages import IntegrityError, PageId, PagePool
from kvbench.engines.kvengine.core.prefix_audit import IndexAudit
from kvbench.engines.kvengine.core.prefix_eviction import Eviction, EvictResult
from kvbench.engines.kvengine.core.prefix_tree import (
    DEVICE_TIER,
    InsertResult,
    Node,
    PrefixMatch,
    PromptMatch,
    common_pages,
    token_bytes,
)

# What callers import from here: the index, and the results its methods return.
__all__ = ["DEVICE_TIER", "EvictResult", "InsertResult", "PrefixIndex", "PrefixMatch", "PromptMatch"]

_UNKEYED = PageKey("")  # the content key of a page nobody below the device tier will ever look up


@dataclass(slots=True)
class PrefixIndex(Eviction, IndexAudit):
    """Radix tree of cached pages over `pool`. See the module docstring for the contracts."""

    pool: PagePool
    events: EventSink = field(default_factory=NullEventLog)
    key_salt: str = ""  # names the model and KV layout in every content key
    journal: PageSink = field(default_factory=NullPageJournal)
    _roots: dict[Namespace, Node] = field(default_factory=dict, repr=False)
    # Per-tenant LRU heaps of leaf candidates (tick, node_id, node); stale entries are skipped on pop.
    _heaps: dict[TenantId, list] = field(default_factory=dict, repr=False)
    _tick: int = 0
    _next_id: int = 1
    _num_nodes: int = 0
    _evictable: int = 0
    _protected: int = 0
    _evictable_by_tenant: dict[TenantId, int] = field(default_factory=dict, repr=False)
    _pages_by_tenant: dict[TenantId, int] = field(default_factory=dict, repr=False)

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    # ---- reads -------------------------------------------------------------------------------------------
    @property
    def cached_pages(self) -> int:
        return self._evictable + self._protected

    @property
    def evictable_pages(self) -> int:
        """Cached pages in unlocked nodes (what `evict` could free)."""
        return self._evictable

    @property
    def protected_pages(self) -> int:
        """Cached pages in nodes locked by a running request."""
        return self._protected

    def evictable_pages_of(self, tenant: TenantId) -> int:
        return self._evictable_by_tenant.get(tenant, 0)

    def pages_of(self, tenant: TenantId) -> int:
        """Cached pages charged to `tenant` (the tenant that inserted them)."""
        return self._pages_by_tenant.get(tenant, 0)

    def pages_by_tenant(self) -> dict[TenantId, int]:
        return {t: k for t, k in self._pages_by_tenant.items() if k}

    def match(self, namespace: Namespace, tokens: np.ndarray) -> PrefixMatch:
        """The longest cached full-page prefix of `tokens` in `namespace`. Changes nothing."""
        ps = self.page_size
        root = self._roots.get(namespace)
        if root is None:
            return PrefixMatch(namespace, (), ps, None)
        n = len(tokens) // ps
        kb = token_bytes(tokens, n, ps)
        pb = 4 * ps
        node, pos, pages = root, 0, []
        while pos < n:
            child = node.children.get(kb[pos * pb : (pos + 1) * pb])
            if child is None:
                break
            clen = len(child.pages)
            seg = kb[pos * pb : (pos + clen) * pb]
            m = clen if seg == child.key else common_pages(seg, child.key, pb)
            pages.extend(child.pages[:m])
            pos += m
            node = child
            if m < clen:
                break
        return PrefixMatch(namespace, tuple(pages), ps, node)

    def match_prompt(self, placement: Placement, tokens: np.ndarray) -> PromptMatch:
        """`match` over each part of `placement` in order; a part is looked up only when the part before it
        matched whole. Changes nothing."""
        ps = self.page_size
        parts: list[PrefixMatch] = []
        for ns, start, end in placement.parts(len(tokens) // ps):
            part = self.match(ns, tokens[start * ps : end * ps])
            parts.append(part)
            if part.num_pages < end - start:
                break
        return PromptMatch(tuple(parts))

    def lock_prompt(self, match: PromptMatch, now: float) -> None:
        for part in match.parts:
            self.lock(part, now)

    def unlock_prompt(self, match: PromptMatch) -> None:
        for part in match.parts:
            self.unlock(part)

    # ---- locks -------------------------------------------------------------------------------------------
    def lock(self, match: PrefixMatch, now: float) -> None:
        """Protect the matched path from eviction and mark it used at `now`.

        A match that ends partway through a node protects only its matched pages: the node is cut there
        (when nobody else holds it) and the unmatched tail stays evictable. Otherwise a request whose prompt
        shares part of one long cached node would pin all of it and, in a full pool, could never be admitted.
        """
        self._tick += 1
        node = match._node
        if node is not None and node.parent is not None and node.lock_ref == 0:
            matched_here = match.num_pages - self._pages_above(node)
            if 0 < matched_here < len(node.pages):
                self._split_tail(node, matched_here)
        while node is not None and node.parent is not None:
            if node.lock_ref == 0:
                self._move_evictable(node, -len(node.pages))
            node.lock_ref += 1
            node.tick = self._tick
            node.last_access = now
            node = node.parent

    def unlock(self, match: PrefixMatch) -> None:
        """Undo one `lock` of the same match."""
        node = match._node
        leaf = node
        while node is not None and node.parent is not None:
            if node.lock_ref <= 0:
                raise IntegrityError("unlock() without a matching lock()")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._move_evictable(node, len(node.pages))
            node = node.parent
        if leaf is not None and leaf.parent is not None:
            self._push_if_leaf(leaf)

    def _move_evictable(self, node: Node, delta: int) -> None:
        self._evictable += delta
        self._protected -= delta
        self._evictable_by_tenant[node.tenant] = self._evictable_by_tenant.get(node.tenant, 0) + delta

    # ---- insert ------------------------------------------------------------------------------------------
    @property
    def _journaling(self) -> bool:
        """Whether anyone below the device tier hears about pages (then every page needs its content key)."""
        return not isinstance(self.journal, NullPageJournal)

    def insert(
        self,
        namespace: Namespace,
        tokens: np.ndarray,
        pages: Sequence[PageId],
        tenant: TenantId,
        now: float,
        adopt_at: int | None = None,
    ) -> InsertResult:
        """Cache the full pages of `tokens`, whose KV is in `pages` (one page id per full page, in order).

        `adopt_at`: if the pages new to the index begin exactly at `pages[adopt_at]`, the index takes over the
        caller's references to them (`num_adopted`) instead of adding its own; the caller must hold one on
        each. A caller whose own pages are `pages[adopt_at:]` keeps them a suffix this way (see the scheduler's
        `borrowed`)."""
        ps = self.page_size
        n = len(tokens) // ps
        if len(pages) < n:
            raise ValueError(f"pages: {len(pages)} page ids for {n} full pages of tokens; pass one per page")
        kb = token_bytes(tokens, n, ps)
        pb = 4 * ps
        self._tick += 1
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = Node(0, None, bytearray(), [], tenant, [root_key(self.key_salt, namespace)])
        node, pos, matched = root, 0, []
        while pos < n:
            child = node.children.get(kb[pos * pb : (pos + 1) * pb])
            if child is None:
                break
            clen = len(child.pages)
            seg = kb[pos * pb : (pos + clen) * pb]
            m = clen if seg == child.key else common_pages(seg, child.key, pb)
            if m < clen:
                child = self._split(child, m)
            child.tick = self._tick
            child.last_access = now
            matched.extend(child.pages)
            node, pos = child, pos + m
        adopted = 0
        if pos < n:
            new_pages = list(pages[pos:n])
            if pos == adopt_at:
                adopted = n - pos
            else:
                self.pool.share(new_pages)
            if self._journaling:
                keys = chain_keys(node.keys[-1], kb[pos * pb : n * pb], pb)
                for key, page in zip(keys, new_pages):
                    self.journal.record_page(PageRecord(PageChange.STORED, key, page, tenant, now))
            else:
                keys = [_UNKEYED] * (n - pos)  # no lower tier listens: skip hashing every page (hot in replays)
            leaf = Node(
                self._next_id,
                node,
                bytearray(kb[pos * pb : n * pb]),
                new_pages,
                tenant,
                keys,
                tick=self._tick,
                last_access=now,
            )
            self._next_id += 1
            self._num_nodes += 1
            node.children[kb[pos * pb : (pos + 1) * pb]] = leaf
            k = n - pos
            self._evictable += k
            self._evictable_by_tenant[tenant] = self._evictable_by_tenant.get(tenant, 0) + k
            self._pages_by_tenant[tenant] = self._pages_by_tenant.get(tenant, 0) + k
            self._push_if_leaf(leaf)
            self.events.record(EventKind.STORED, tenant, DEVICE_TIER, k, now)
            matched.extend(new_pages)
            node = leaf
        elif node is not root:
            self._push_if_leaf(node)
        return InsertResult(
            num_pages=n,
            num_cached=pos,
            matches=(PrefixMatch(namespace, tuple(matched), ps, node),),
            num_adopted=adopted,
        )

    def insert_prompt(
        self,
        placement: Placement,
        tokens: np.ndarray,
        pages: Sequence[PageId],
        tenant: TenantId,
        now: float,
        adopt_at: int | None = None,
    ) -> InsertResult:
        """`insert` of each part of `placement` (the full pages of `tokens`, one page id per full page).

        `adopt_at` (a page of the whole prompt) is `insert`'s, carried from part to part: a part adopts only if
        its new pages begin where the caller's own pages then begin, so those stay a suffix."""
        ps = self.page_size
        num_pages = num_cached = num_adopted = 0
        matches: list[PrefixMatch] = []
        for ns, start, end in placement.parts(len(tokens) // ps):
            at = None if adopt_at is None else adopt_at + num_adopted - start
            part = self.insert(ns, tokens[start * ps : end * ps], pages[start:end], tenant, now, adopt_at=at)
            num_pages, num_cached = num_pages + part.num_pages, num_cached + part.num_cached
            num_adopted += part.num_adopted
            matches.extend(part.matches)
        return InsertResult(num_pages, num_cached, tuple(matches), num_adopted)

    @staticmethod
    def _pages_above(node: Node) -> int:
        """Pages on the path from the root down to `node`, `node` excluded."""
        total, parent = 0, node.parent
        while parent is not None:
            total += len(parent.pages)
            parent = parent.parent
        return total

    def _split_tail(self, node: Node, m: int) -> Node:
        """Cut `node` after its first m pages, keeping `node` as the head (so matches that point at it stay
        valid); a new child takes the tail and the children. Returns the tail. `node` must be unlocked."""
        pb = 4 * self.page_size
        tail = Node(
            self._next_id,
            node,
            node.key[m * pb :],
            node.pages[m:],
            node.tenant,
            node.keys[m:],
            children=node.children,
            tick=node.tick,
            last_access=node.last_access,
        )
        self._next_id += 1
        self._num_nodes += 1
        for child in tail.children.values():
            child.parent = tail
        node.key, node.pages, node.keys = node.key[: m * pb], node.pages[:m], node.keys[:m]
        node.children = {bytes(tail.key[:pb]): tail}
        self._push_if_leaf(tail)
        return tail

    def _split(self, child: Node, m: int) -> Node:
        """Cut `child` after its first m pages; the new upper node takes them. Returns the upper node."""
        pb = 4 * self.page_size
        parent = child.parent
        assert parent is not None
        upper = Node(
            self._next_id,
            parent,
            child.key[: m * pb],
            child.pages[:m],
            child.tenant,
            child.keys[:m],
            lock_ref=child.lock_ref,
            tick=child.tick,
            last_access=child.last_access,
        )
        self._next_id += 1
        self._num_nodes += 1
        parent.children[bytes(upper.key[:pb])] = upper
        child.key = child.key[m * pb :]
        child.pages = child.pages[m:]
        child.keys = child.keys[m:]
        child.parent = upper
        upper.children[bytes(child.key[:pb])] = child
        return upper
