"""Benchmark of the pure KV core: prefix index operations per second and a Mooncake trace replay.

Run: python benchmarks/core_bench.py [--trace PATH] [--quick]
Prints a table. Speed targets (the whole Mooncake synthetic trace at 3 capacities in < 5 s) are checked by
reading the table, never by tests.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from kvbench.engines.kvengine.core.namespaces import Namespace, TenantId
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.trace_replay import replay_prefix_hits

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
BLOCK = 512  # Mooncake hash_ids cover 512-token blocks
VOCAB = 32000


def block_tokens(h: int) -> np.ndarray:
    """A fixed pseudo-random block of 512 token ids for hash id h (splitmix64 of h*512+i)."""
    x = (np.uint64(h) * np.uint64(BLOCK) + np.arange(BLOCK, dtype=np.uint64)) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(VOCAB)).astype(np.int32)


def mooncake_prompts(path: Path):
    """Expand each row's hash_ids to token ids; the last block is cut to input_length (a prefix of it)."""
    cache: dict[int, np.ndarray] = {}
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            ids = row["hash_ids"]
            for h in ids:
                if h not in cache:
                    cache[h] = block_tokens(h)
            yield np.concatenate([cache[h] for h in ids])[: row["input_length"]]


def bench_index(total_tokens: int, prompt_tokens: int = 2048, page_size: int = 16) -> list[tuple[str, float]]:
    """Ops/s of match, insert and evict on a tree holding `total_tokens` tokens in random 2K-token prompts
    that share a 512-token system prefix among 64 variants (a bushy tree)."""
    rng = np.random.default_rng(0)
    n_prompts = total_tokens // prompt_tokens
    prefixes = rng.integers(0, VOCAB, (64, 512), dtype=np.int32)
    prompts = [
        np.concatenate([prefixes[i % 64], rng.integers(0, VOCAB, prompt_tokens - 512, dtype=np.int32)])
        for i in range(n_prompts)
    ]
    pool = PagePool(1 + total_tokens // page_size + 64, page_size)
    index = PrefixIndex(pool)
    ns, tenant = Namespace("bench"), TenantId("bench")
    rows = []
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        m = index.match(ns, p)
        pages = pool.allocate(len(p) // page_size - m.num_pages)
        index.insert(ns, p, list(m.pages) + pages, tenant, float(i))
        pool.release(pages)
    rows.append((f"insert ({n_prompts} x {prompt_tokens}-token prompts)", n_prompts / (time.perf_counter() - t0)))
    t0 = time.perf_counter()
    hits = 0
    for p in prompts:
        hits += index.match(ns, p).num_pages
    rows.append((f"match (full hits, {prompt_tokens // page_size} pages each)", n_prompts / (time.perf_counter() - t0)))
    assert hits * page_size == n_prompts * prompt_tokens
    t0 = time.perf_counter()
    n_evicts = 0
    while index.evictable_pages:
        index.evict(8, float(n_prompts))
        n_evicts += 1
    rows.append(("evict (8 pages per call, until empty)", n_evicts / (time.perf_counter() - t0)))
    index.check_integrity()
    pool.check_integrity()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--capacities", default="1048576,4194304,16777216", help="LRU cache sizes in tokens")
    ap.add_argument("--tree-tokens", type=int, default=1 << 20)
    args = ap.parse_args()

    print(f"| operation (tree of {args.tree_tokens:,} tokens) | ops/s |")
    print("|---|---|")
    for name, rate in bench_index(args.tree_tokens):
        print(f"| {name} | {rate:,.0f} |")

    caps = tuple(int(c) for c in args.capacities.split(","))
    t0 = time.perf_counter()
    stats = replay_prefix_hits(mooncake_prompts(args.trace), page_size=16, capacities_tokens=caps)
    dt = time.perf_counter() - t0
    print()
    print(
        f"Trace replay: {args.trace.name}, {stats.requests:,} requests, {stats.prompt_tokens:,} prompt tokens, "
        f"{dt:.2f} s (including JSON parsing and token expansion)"
    )
    print()
    print("| cache | token hit rate |")
    print("|---|---|")
    print(f"| unbounded | {stats.unbounded_token_hit_rate:.2%} |")
    for c, r in stats.lru_token_hit_rate.items():
        print(f"| LRU {c:,} tokens | {r:.2%} |")


if __name__ == "__main__":
    main()
