"""The prefix index's integrity check: a walk of every tree that recounts what the index's counters claim (pages,
evictable and protected pages, per tenant) and the pool references its pages hold. `PrefixIndex` inherits it;
the tree and its counters are the index's (`prefix_index`).
"""

from __future__ import annotations

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.pages import IntegrityError, PageId


class IndexAudit:
    """`check_integrity`, `cached_page_ids` and `evictable_page_ids` of PrefixIndex (whose fields they read)."""

    __slots__ = ()

    def cached_page_ids(self) -> list[PageId]:
        """Every page the index holds (for integrity checks and tests)."""
        out: list[PageId] = []
        for _, node in self._walk():
            out.extend(node.pages)
        return out

    def evictable_page_ids(self) -> list[PageId]:
        """The pages of unlocked nodes: what `evict` may free (for integrity checks and tests)."""
        out: list[PageId] = []
        for _, node in self._walk():
            if not node.lock_ref:
                out.extend(node.pages)
        return out

    def _walk(self):
        for ns, root in self._roots.items():
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                yield ns, node
                stack.extend(node.children.values())

    def check_integrity(self) -> None:
        """Raise IntegrityError on any broken invariant of the tree or its pool references."""
        pb = 4 * self.page_size
        seen: set[int] = set()
        evictable = protected = nodes = 0
        ev_t: dict[TenantId, int] = {}
        pages_t: dict[TenantId, int] = {}
        for _, node in self._walk():
            nodes += 1
            if not node.pages or len(node.key) != len(node.pages) * pb or len(node.keys) != len(node.pages):
                raise IntegrityError(f"node {node.node_id}: {len(node.pages)} pages for {len(node.key)} bytes")
            if node.parent is None or node.parent.children.get(bytes(node.key[:pb])) is not node:
                raise IntegrityError(f"node {node.node_id} is not its parent's child under its first page")
            if node.lock_ref < 0 or (node.parent.parent is not None and node.parent.lock_ref < node.lock_ref):
                raise IntegrityError(f"node {node.node_id}: lock_ref {node.lock_ref} exceeds its parent's")
            if node.parent.parent is not None and node.parent.tick < node.tick:
                raise IntegrityError(f"node {node.node_id} used more recently than its parent")
            for p in node.pages:
                if p in seen or self.pool.ref_count(p) < 1:
                    raise IntegrityError(f"page {p} cached twice or without a pool reference")
                seen.add(p)
            if node.lock_ref:
                protected += len(node.pages)
            else:
                evictable += len(node.pages)
                ev_t[node.tenant] = ev_t.get(node.tenant, 0) + len(node.pages)
            pages_t[node.tenant] = pages_t.get(node.tenant, 0) + len(node.pages)
        if (evictable, protected, nodes) != (self._evictable, self._protected, self._num_nodes):
            raise IntegrityError(
                f"counters: evictable/protected/nodes {self._evictable}/{self._protected}/"
                f"{self._num_nodes} != walked {evictable}/{protected}/{nodes}"
            )
        for counted, walked in ((self._evictable_by_tenant, ev_t), (self._pages_by_tenant, pages_t)):
            if {t: k for t, k in counted.items() if k} != walked:
                raise IntegrityError(f"per-tenant counters {counted} != walked {walked}")
