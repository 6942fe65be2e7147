"""Lower KV tier throughput and restore latency; prints a table.

1. host <-> disk page throughput (DiskStore: one checksummed file per page, written atomically) against a
   plain sequential write/read of the same bytes into one file on the same disk (target >= 70%);
2. restore latency of a 4K-token session from each tier (tiny model; time from add to first token), with
   recomputing it as the reference;
3. Redis tier throughput on loopback (a redis-server started here).

Run: python benchmarks/tiers_bench.py [--pages 512 --page-kib 256]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kvbench.engines.kvengine.runtime.budget_probe import build_engine  # noqa: E402
from kvbench.engines.kvengine.runtime.engine import Engine  # noqa: E402
from kvbench.engines.kvengine.runtime.requests import GenerationRequest  # noqa: E402
from kvbench.engines.kvengine.runtime.tier_stores import DiskStore, RedisStore  # noqa: E402
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model  # noqa: E402
from kvbench.engines.kvengine.settings.config import EngineConfig  # noqa: E402


def disk_vs_plain(root: Path, pages: list[bytes]) -> list[tuple[str, float]]:
    total = sum(len(p) for p in pages) / 1e6
    store = DiskStore(root / "store", "bench")
    t = time.perf_counter()
    for i, page in enumerate(pages):
        store.put(f"{i:032x}", page)
    store_write = total / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(len(pages)):
        assert store.get(f"{i:032x}") is not None
    store_read = total / (time.perf_counter() - t)
    plain = root / "plain.bin"
    t = time.perf_counter()
    with open(plain, "wb") as f:
        for page in pages:
            f.write(page)
    plain_write = total / (time.perf_counter() - t)
    t = time.perf_counter()
    with open(plain, "rb") as f:
        while f.read(len(pages[0])):
            pass
    plain_read = total / (time.perf_counter() - t)
    return [
        ("host->disk write MB/s (pages | plain | ratio)", store_write, plain_write),
        ("disk->host read MB/s (pages | plain | ratio)", store_read, plain_read),
    ]


def restore_latency(root: Path, redis_url: str | None) -> list[tuple[str, float]]:
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    loaded = tiny_loaded_model(0)
    prompt = tuple(np.random.default_rng(0).integers(0, 256, 4096).tolist())
    rows = []
    for tier in ("recompute", "device", "host", "disk", "remote"):
        clock = Clock()
        settings = dict(
            kv_capacity=16384,
            max_step_tokens=4096,
            tier_interval_s=0.0,
            host_capacity=8192 if tier == "host" else 0,
            disk_capacity=8192 if tier == "disk" else 0,
            disk_dir=str(root / f"d-{tier}"),
        )
        engine = build_engine(
            EngineConfig(**settings, remote_url=redis_url if tier == "remote" else None), loaded, clock
        )
        if tier != "recompute":
            _ttft(engine, GenerationRequest("warm", prompt, 1, ignore_eos=True))
        if tier in ("host", "disk"):
            clock.now += 31 if tier == "host" else 31
            engine.step()
            if tier == "disk":
                clock.now += 601
                engine.step()
        if tier == "remote":
            engine.close()
            engine = build_engine(EngineConfig(**settings, remote_url=redis_url), loaded, clock)
        rows.append(
            (
                f"4K-token session TTFT from {tier} (ms)",
                1000 * _ttft(engine, GenerationRequest("r", prompt + (7,), 1, ignore_eos=True)),
                None,
            )
        )
        engine.close()
    return rows


def _ttft(engine: Engine, request: GenerationRequest) -> float:
    start = time.perf_counter()
    engine.add(request)
    while engine.has_work():
        for output in engine.step():
            if output.token_id is not None:
                elapsed = time.perf_counter() - start
    return elapsed


def redis_throughput(url: str, pages: list[bytes]) -> list[tuple[str, float]]:
    store = RedisStore(url, "bench")
    total = sum(len(p) for p in pages) / 1e6
    t = time.perf_counter()
    for i, page in enumerate(pages):
        store.put(f"{i:032x}", page)
    put = total / (time.perf_counter() - t)
    t = time.perf_counter()
    got = store.get_many([f"{i:032x}" for i in range(len(pages))])
    get = total / (time.perf_counter() - t)
    assert all(g is not None for g in got)
    return [("redis put MB/s (one page per SET)", put, None), ("redis get MB/s (MGET)", get, None)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=512)
    parser.add_argument("--page-kib", type=int, default=256)
    parser.add_argument("--dir", help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    pages = [rng.integers(0, 256, args.page_kib * 1024, dtype=np.uint8).tobytes() for _ in range(args.pages)]
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.engines.kvengine.runtime.tiers_fixtures import redis_server

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, redis_server(Path(tmp)) as redis:
        rows = disk_vs_plain(Path(tmp), pages)
        rows += redis_throughput(redis.url, pages)
        rows += restore_latency(Path(tmp), redis.url)
    print(f"{'measure':52} {'value':>10} {'plain':>10} {'ratio':>7}")
    for name, value, plain in rows:
        ratio = f"{value / plain:.0%}" if plain else ""
        print(f"{name:52} {value:10.1f} {'' if plain is None else f'{plain:10.1f}':>10} {ratio:>7}")
    _ = subprocess


if __name__ == "__main__":
    main()
