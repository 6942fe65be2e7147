"""Capture the real /metrics dumps the reconcile_lmcache tests read (run by hand; needs vLLM + LMCache):

    KVBENCH_VLLM_PYTHON=/path/to/venv-vllm/bin/python python tests/data/lmcache/capture.py

Two engine instances on one loopback Redis, as the lmcache-redis-restart row: `first` (a repeated prefix, stored
then retrieved from LMCache's DRAM after vLLM's own cache is dropped) and `second` (a new vLLM and LMCache server
reading the prefix from Redis). For each: vLLM's and the cache server's /metrics text before and after, and
every request's usage.cached_tokens, in <name>.json beside this script.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from kvbench.engines.http import request
from kvbench.engines.launch import send_probe
from kvbench.engines.lmcache import LMCacheAdapter
from kvbench.engines.redis_store import redis_server

HERE = Path(__file__).resolve().parent
PROMPT = [100 + (7907 * index + 5) % 30000 for index in range(1100)]  # 4 LMCache chunks of 256 and a tail


def dumps(adapter: LMCacheAdapter) -> dict[str, str]:
    servers = {"vllm": adapter.server.base_url, "lmcache_server": adapter.cache_server.base_url}
    return {name: request("GET", url + "/metrics", timeout_s=30).body for name, url in servers.items()}


def capture(name: str, settings: dict, workdir: Path, drop_vllm_cache: bool) -> None:
    adapter = LMCacheAdapter(settings, workdir)
    adapter.start()
    try:
        adapter.wait_healthy(900)
        before = dumps(adapter)
        cached = [send_probe(adapter.server.base_url, adapter.served_model, PROMPT).cached_tokens]
        if drop_vllm_cache:  # vLLM's cache dropped, LMCache's kept: the prefix comes back through the connector
            adapter.server.post("/reset_prefix_cache")
            cached.append(send_probe(adapter.server.base_url, adapter.served_model, PROMPT).cached_tokens)
        after = dumps(adapter)
    finally:
        adapter.stop()
    record = {"prompt_tokens": len(PROMPT), "cached_tokens": cached, "before": before, "after": after}
    (HERE / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(name, cached)


def main() -> None:
    python = os.environ.get("KVBENCH_VLLM_PYTHON")
    if not python:
        sys.exit("KVBENCH_VLLM_PYTHON: set it to the interpreter of a venv with vllm and lmcache")
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp) / "redis") as store:
        settings = {
            "python": python,
            "dtype": "float32",
            "enforce_eager": True,
            "max_model_len": 2048,
            "cpu_kv_cache_space_gib": 1,
            "max_local_cpu_size": 1,
            "remote_url": store.url,
            "env": {"OMP_NUM_THREADS": "2"},
        }
        capture("first", settings, Path(tmp) / "first", drop_vllm_cache=True)
        capture("second", settings, Path(tmp) / "second", drop_vllm_cache=False)


if __name__ == "__main__":
    main()
