"""Content keys of cached pages: a hash chain over page-aligned token ids, salted per namespace and per model.

    key(page 0) = H(root, tokens[0:ps])        root = H(salt, namespace)
    key(page i) = H(key(page i-1), tokens[i*ps:(i+1)*ps])

`salt` names everything that decides what a page's bytes mean (the model and its KV layout: dtype, scales,
page size), so a page stored by another model or another KV dtype never has the same key; the namespace
(a tenant's salt in strict isolation) keeps tenants apart. Keys are hex strings: safe as file names and
Redis keys. Pure: no I/O, no state.
"""

from __future__ import annotations

import hashlib
from typing import NewType

import numpy as np

PageKey = NewType("PageKey", str)
_DIGEST = 16


def root_key(salt: str, namespace: str) -> PageKey:
    return PageKey(hashlib.blake2b(f"{salt}\x00{namespace}".encode(), digest_size=_DIGEST).hexdigest())


def chain_keys(parent: PageKey, token_bytes: bytes, page_bytes: int) -> list[PageKey]:
    """Keys of consecutive pages whose int32 token bytes are `token_bytes`, continuing the chain at `parent`."""
    keys: list[PageKey] = []
    for start in range(0, len(token_bytes) - page_bytes + 1, page_bytes):
        h = hashlib.blake2b(parent.encode(), digest_size=_DIGEST)
        h.update(token_bytes[start : start + page_bytes])
        parent = PageKey(h.hexdigest())
        keys.append(parent)
    return keys


def page_keys(salt: str, namespace: str, tokens: np.ndarray, page_size: int) -> list[PageKey]:
    """Keys of every full page of `tokens` in `namespace` (the same keys the prefix index gives its pages)."""
    n = len(tokens) // page_size
    data = np.asarray(tokens)[: n * page_size].astype(np.int32, copy=False).tobytes()
    return chain_keys(root_key(salt, namespace), data, 4 * page_size)


def token_digest(tokens: np.ndarray) -> str:
    """A short digest of token ids, to name a namespace after the content it continues."""
    data = np.asarray(tokens).astype(np.int32, copy=False).tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()
