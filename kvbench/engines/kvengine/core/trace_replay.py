"""Trace statistics: replay prompts through the core's own page pool and prefix index, count prefix hits.

`replay_prefix_hits` feeds every prompt, in order, to an unbounded cache and to one LRU-evicting cache per
capacity. Each cache is a PagePool + PrefixIndex, the same policy code the engine runs; a prompt's hit is
its cached full-page prefix at arrival, and the prompt is then inserted (its matched path locked while the
cache makes room). Only full pages are cached, so a prompt's last partial page never hits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from kvbench.engines.kvengine.core.namespaces import Namespace, TenantId
from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE, PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex

_NS = Namespace("trace")
_TENANT = TenantId("trace")


@dataclass(frozen=True, slots=True)
class TraceCacheStats:
    """Hit rates are shares of prompt tokens; `lru_token_hit_rate` is keyed by capacity in tokens."""

    requests: int
    prompt_tokens: int
    unbounded_token_hit_rate: float | None  # None when there were no prompt tokens (missing, not 0)
    lru_token_hit_rate: dict[int, float | None] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "unbounded_token_hit_rate": self.unbounded_token_hit_rate,
            "lru_token_hit_rate": {str(k): v for k, v in self.lru_token_hit_rate.items()},
        }


@dataclass(slots=True)
class _ReplayCache:
    index: PrefixIndex
    unbounded: bool
    hit_tokens: int = 0

    def feed(self, prompt: np.ndarray, now: float) -> None:
        index, pool = self.index, self.index.pool
        match = index.match(_NS, prompt)
        self.hit_tokens += match.num_tokens
        need = len(prompt) // pool.page_size - match.num_pages
        if need <= 0:
            index.lock(match, now)  # a touch: the whole prompt was cached
            index.unlock(match)
            return
        index.lock(match, now)
        if pool.num_free < need:
            if self.unbounded:
                pool.grow(max(need - pool.num_free, pool.num_pages))
            else:
                index.evict(need - pool.num_free, now)
        take = min(need, pool.num_free)  # a prompt longer than the cache keeps only its head
        pages = pool.allocate(take)
        if take:
            end = (match.num_pages + take) * pool.page_size
            index.insert(_NS, prompt[:end], list(match.pages) + pages, _TENANT, now)
            pool.release(pages)  # the index holds its own references now
        index.unlock(match)


def replay_prefix_hits(
    prompts: Iterable[np.ndarray],
    page_size: int = DEFAULT_PAGE_SIZE,
    capacities_tokens: Sequence[int] = (),
) -> TraceCacheStats:
    """Replay `prompts` (1-D int token id arrays, in arrival order) and return prefix hit rates.

    unbounded_token_hit_rate: share of prompt tokens in full pages whose prefix was sent earlier.
    lru_token_hit_rate[c]: the same for an LRU-evicting cache of c tokens (c // page_size pages).
    """
    for c in capacities_tokens:
        if c < page_size:
            raise ValueError(f"capacities_tokens: {c} is less than one page of {page_size} tokens")
    caches = [_ReplayCache(PrefixIndex(PagePool(1 + 1024, page_size)), unbounded=True)]
    caches += [_ReplayCache(PrefixIndex(PagePool(1 + c // page_size, page_size)), False) for c in capacities_tokens]
    requests = prompt_tokens = 0
    for prompt in prompts:
        arr = np.asarray(prompt)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"prompts[{requests}]: expected a 1-D integer array of token ids, got {arr.dtype} of shape {arr.shape}"
            )
        arr = arr.astype(np.int32, copy=False)
        for cache in caches:
            cache.feed(arr, float(requests))
        requests += 1
        prompt_tokens += len(arr)

    def rate(hits: int) -> float | None:
        return hits / prompt_tokens if prompt_tokens else None

    return TraceCacheStats(
        requests=requests,
        prompt_tokens=prompt_tokens,
        unbounded_token_hit_rate=rate(caches[0].hit_tokens),
        lru_token_hit_rate={c: rate(k.hit_tokens) for c, k in zip(capacities_tokens, caches[1:])},
    )
