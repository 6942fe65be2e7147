"""Cache namespaces: which tenants may share which pages.

In strict isolation every tenant's pages live in a namespace of its own (the tenant's salt), so no match can
cross tenants. In `shared-prefix` mode a prompt's pages may span two namespaces (a `Placement`): the full
pages of a prefix declared shareable (a tenants file's `shared_prefixes`) go to SHARED_NAMESPACE, every later
page to a namespace of the tenant's own that continues after that prefix. So tenants share a declared system
prompt, never what follows it, and `cached_tokens` tells a tenant nothing about other tenants' private
prompts. Pure: ints and token ids in, small frozen values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

import numpy as np

from kvbench.engines.kvengine.core.content_keys import PageKey, page_keys, token_digest

Namespace = NewType("Namespace", str)
TenantId = NewType("TenantId", str)
SHARED_NAMESPACE = Namespace("shared")


def namespace_for(tenant: TenantId, *, shareable: bool, strict: bool) -> Namespace:
    """The namespace a tenant's prompt is cached under.

    strict isolation: always the tenant's own salt. `shared-prefix` mode: a prompt marked shareable as a
    whole goes to SHARED_NAMESPACE, anything else to the tenant's salt. (A prompt whose declared shareable
    part is a prefix spans two namespaces: see `placement_for`.)
    """
    if shareable and not strict:
        return SHARED_NAMESPACE
    return Namespace(f"tenant:{tenant}")


def shared_tokens_of(prompt: np.ndarray, shared_prefixes: Sequence[np.ndarray]) -> int:
    """How many leading tokens of `prompt` are declared shareable: its longest common prefix with any of
    `shared_prefixes` (so a prompt that tokenises its last shared token differently still shares the rest)."""
    best = 0
    prompt = np.asarray(prompt)
    for prefix in shared_prefixes:
        n = min(len(prompt), len(prefix))
        diff = np.flatnonzero(prompt[:n] != np.asarray(prefix)[:n])
        best = max(best, int(diff[0]) if len(diff) else n)
    return best


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a prompt's full pages are cached: pages [0, shared_pages) under SHARED_NAMESPACE, every later
    page under `own`."""

    own: Namespace
    shared_pages: int = 0

    def parts(self, num_pages: int) -> tuple[tuple[Namespace, int, int], ...]:
        """(namespace, first page, end page) of each non-empty part of pages [0, num_pages), in order."""
        cut = min(self.shared_pages, num_pages)
        head = ((SHARED_NAMESPACE, 0, cut),) if cut else ()
        return head + (((self.own, cut, num_pages),) if num_pages > cut else ())

    def page_keys(self, salt: str, tokens: np.ndarray, page_size: int) -> list[PageKey]:
        """Content keys of every full page of `tokens` (the keys the index gives them)."""
        keys: list[PageKey] = []
        for ns, start, end in self.parts(len(tokens) // page_size):
            keys += page_keys(salt, ns, tokens[start * page_size : end * page_size], page_size)
        return keys


def placement_for(
    tenant: TenantId, prompt: np.ndarray, *, shared_tokens: int, page_size: int, strict: bool
) -> Placement:
    """The placement of a tenant's prompt whose first `shared_tokens` tokens are declared shareable.

    Strict isolation, or less than a page declared: all of it in the tenant's namespace. Otherwise the
    declared full pages are shared, and the rest goes to the tenant's namespace after that prefix, named by
    the prefix's tokens (the same private text after two different shared prefixes is different KV).
    """
    own = namespace_for(tenant, shareable=False, strict=True)
    shared_pages = shared_tokens // page_size
    if strict or shared_pages == 0:
        return Placement(own)
    after = token_digest(np.asarray(prompt)[: shared_pages * page_size])
    return Placement(Namespace(f"{own}@{after}"), shared_pages)
