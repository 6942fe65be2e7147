"""The exact `reusable_tokens` oracle: how much of a prompt was already sent earlier in the same namespace.

`PrefixOracle.observe` answers the longest common prefix (token-exact, not page-aligned) between a new
sequence and any sequence observed before it in its namespace, then records the new sequence. There is no
approximation: no hashes stand in for tokens.

How it stays fast on millions of tokens: each namespace is a trie of fixed blocks of `block_tokens` ids whose
edges are keyed by the block's raw bytes (a dict lookup hashes and compares the bytes exactly). A query walks
full blocks to the deepest matching node, then extends token by token into the next block, comparing with the
continuations recorded at that node, bucketed by their first token (so only continuations that match at least
one token are compared):

    tokens:  | block 0 | block 1 | block 2 | blo..                 query
    trie:    | block 0 | block 1 | blo XY..                       an earlier sequence
             '-- walked full blocks --'-ext-'                      answer = 2 * block_tokens + 3

Memory is about the number of distinct block-prefixes times (block bytes + ~150 bytes); the block size changes
speed and memory only, never the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.workloads.spec import TOKEN_DTYPE

_ITEM = np.dtype(TOKEN_DTYPE).itemsize


@dataclass(slots=True)
class _Node:
    """A block-prefix seen before. `children` by next full block; `continuations` by their first token's bytes."""

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
        while pos + step <= len(data):
            child = node.children.get(data[pos:pos + step])
            if child is None:
                break
            node = child
            pos += step
        head = data[pos:pos + step]
        extension = max((_common_prefix_bytes(head, c) for c in node.continuations.get(head[:_ITEM], ())),
                        default=0)
        reused = (pos + extension) // _ITEM
        self._record(node, data, pos, step, covered=extension == len(head))
        return reused

    def _record(self, node: _Node, data: bytes, pos: int, step: int, covered: bool) -> None:
        """Adds data[pos:] below `node`; `covered` means its next block is already a prefix of a continuation."""
        if covered and len(data) - pos < step:
            return  # a partial tail that an earlier continuation already contains adds nothing
        while pos < len(data):
            block = data[pos:pos + step]
            if len(block) < step:
                node.continuations.setdefault(block[:_ITEM], []).append(block)
                return
            child = _Node()
            node.children[block] = child
            node.continuations.setdefault(block[:_ITEM], []).append(block)
            node = child
            pos += step


def _common_prefix_bytes(a: bytes, b: bytes) -> int:
    """Length in bytes of the common prefix of two token byte strings, rounded down to whole tokens."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    left = np.frombuffer(a, dtype=TOKEN_DTYPE, count=n // _ITEM)
    right = np.frombuffer(b, dtype=TOKEN_DTYPE, count=n // _ITEM)
    return int(np.argmin(left == right)) * _ITEM
