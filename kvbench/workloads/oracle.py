"""The exact `reusable_tokens` oracle: how much of a prompt was already sent earlier in the same namespace.

`PrefixOracle.observe` answers the longest common prefix (token-exact, not page-aligned) between a new
sequence and any sequence observed before it in its namespace, then records the new sequence. There is no
approximation: no hashes stand in for tokens.

How it stays fast on millions of tokens: each namespace is a radix tree over fixed blocks of `block_tokens`
ids. An edge holds one or more whole blocks (a run no other sequence branched from), children are keyed by
their edge's first block (a dict lookup hashes and compares the bytes exactly), so a query compares a whole
edge at once and a new sequence adds at most two nodes. A query walks whole edges; where it leaves an edge
partway, the common prefix with that edge is the answer. Where it stops at a node, it extends token by token
into the next block, comparing with the continuations recorded at that node (the first block of each child
and the partial tails that ended there), bucketed by their first token (so only continuations that match at
least one token are compared):

    tokens:  | block 0 | block 1 | block 2 | blo..                 query
    trie:    | block 0   block 1 | blo XY..                       an earlier sequence (one edge, then a tail)
             '-- walked edges ---'-ext-'                           answer = 2 * block_tokens + 3

Memory is about the distinct tokens observed (4 bytes each) plus ~300 bytes per observed sequence; the block
size changes speed and memory only, never the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.workloads.spec import TOKEN_DTYPE

_ITEM = np.dtype(TOKEN_DTYPE).itemsize


@dataclass(slots=True, eq=False)
class _Node:
    """A block-aligned prefix seen before, reached from its parent over `edge` (whole blocks; empty at a root).
    `children` by their edge's first block; `continuations` (children's first blocks and partial tails that
    ended here) by their first token's bytes."""

    edge: bytes = b""
    children: dict[bytes, _Node] = field(default_factory=dict)
    continuations: dict[bytes, list[bytes]] = field(default_factory=dict)


@dataclass(slots=True)
class PrefixOracle:
    """Longest previously observed prefix per namespace (e.g. a tenant, or one shared namespace)."""

    block_tokens: int = 64
    _roots: dict[str, _Node] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")

    def observe(self, namespace: str, tokens: np.ndarray) -> int:
        """The number of leading tokens of `tokens` already observed in `namespace`; then records `tokens`."""
        data = np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes()
        step = self.block_tokens * _ITEM
        node = self._roots.setdefault(namespace, _Node())
        pos = 0
        while (child := node.children.get(data[pos : pos + step])) is not None:
            edge = child.edge
            segment = data[pos : pos + len(edge)]
            if segment != edge:
                # The sequence ends inside this edge or leaves it (at least one block in: the key matched).
                common = _common_prefix_bytes(segment, edge)
                if common < len(segment):
                    self._record(
                        self._split(node, child, common // step * step, step),
                        data,
                        pos + common // step * step,
                        step,
                        covered=False,
                    )
                return (pos + common) // _ITEM
            node = child
            pos += len(edge)
        head = data[pos : pos + step]
        extension = max((_common_prefix_bytes(head, c) for c in node.continuations.get(head[:_ITEM], ())), default=0)
        reused = (pos + extension) // _ITEM
        self._record(node, data, pos, step, covered=extension == len(head))
        return reused

    @staticmethod
    def _split(parent: _Node, child: _Node, cut: int, step: int) -> _Node:
        """Cut `child`'s edge after `cut` bytes (whole blocks, at least one); returns the new upper node."""
        upper = _Node(child.edge[:cut])
        child.edge = child.edge[cut:]
        parent.children[upper.edge[:step]] = upper
        upper.children[child.edge[:step]] = child
        upper.continuations[child.edge[:_ITEM]] = [child.edge[:step]]
        return upper

    @staticmethod
    def _record(node: _Node, data: bytes, pos: int, step: int, covered: bool) -> None:
        """Adds data[pos:] below `node`, which has no child for its next block; `covered` means that block is a
        partial one that a continuation at `node` already contains."""
        if covered and len(data) - pos < step:
            return  # a partial tail that an earlier continuation already contains adds nothing
        full = pos + (len(data) - pos) // step * step
        if full > pos:  # the whole blocks: one new edge
            child = _Node(data[pos:full])
            node.children[data[pos : pos + step]] = child
            node.continuations.setdefault(data[pos : pos + _ITEM], []).append(data[pos : pos + step])
            node, pos = child, full
        if pos < len(data):  # the partial tail, below the new edge
            tail = data[pos:]
            node.continuations.setdefault(tail[:_ITEM], []).append(tail)


def _common_prefix_bytes(a: bytes, b: bytes) -> int:
    """Length in bytes of the common prefix of two token byte strings, rounded down to whole tokens."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    left = np.frombuffer(a, dtype=TOKEN_DTYPE, count=n // _ITEM)
    right = np.frombuffer(b, dtype=TOKEN_DTYPE, count=n // _ITEM)
    return int(np.argmin(left == right)) * _ITEM
