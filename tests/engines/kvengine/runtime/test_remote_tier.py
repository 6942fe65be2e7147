"""The shared Redis tier: two engines share a prefix through one real redis-server; a stopped Redis is skipped."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model

from .tiers_fixtures import greedy, make_engine, redis_server, run, tokens

PROMPT = list(range(300, 380))


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded_model(seed=3)


@pytest.fixture
def redis(tmp_path):
    with redis_server(tmp_path) as server:
        yield server


def test_a_prefix_computed_on_engine_a_is_a_remote_hit_on_engine_b(loaded, redis):
    a = make_engine(loaded, remote_url=redis.url)
    b = make_engine(loaded, remote_url=redis.url)
    first = run(a, greedy("a", PROMPT))["a"]
    second = run(b, greedy("b", PROMPT))["b"]
    assert first[-1].cached_tokens == 0
    assert second[-1].cached_tokens_by_tier == {"remote": 64}
    assert tokens(second) == tokens(first)
    a.close(), b.close()


def test_another_kv_dtype_or_model_never_hits_the_shared_pages(loaded, redis):
    run(make_engine(loaded, remote_url=redis.url), greedy("a", PROMPT))
    fp8 = run(make_engine(loaded, remote_url=redis.url, kv_dtype="fp8_e4m3"), greedy("b", PROMPT))["b"]
    other = run(make_engine(tiny_loaded_model(seed=4), remote_url=redis.url), greedy("c", PROMPT))["c"]
    assert fp8[-1].cached_tokens == 0 and other[-1].cached_tokens == 0


def test_a_second_engine_process_hits_what_this_one_computed(loaded, redis):
    run(make_engine(loaded, remote_url=redis.url), greedy("a", PROMPT))
    script = textwrap.dedent(f"""
        from kvbench.engines.kvengine.config import EngineConfig
        from kvbench.engines.kvengine.runtime.engine import Engine
        from kvbench.engines.kvengine.runtime.requests import GenerationRequest
        from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
        engine = Engine(EngineConfig(kv_capacity=2048, remote_url={redis.url!r}), tiny_loaded_model(seed=3))
        engine.add(GenerationRequest("b", tuple(range(300, 380)), 8, ignore_eos=True))
        last = None
        while engine.has_work():
            for output in engine.step():
                last = output
        print(last.cached_tokens_by_tier)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "{'remote': 64}"


def test_a_stopped_redis_leaves_the_engine_serving_and_is_counted(loaded, redis):
    engine = make_engine(loaded, remote_url=redis.url)
    reference = tokens(run(make_engine(loaded), greedy("ref", PROMPT))["ref"])
    redis.stop()
    out = run(engine, greedy("a", PROMPT))["a"]
    assert tokens(out) == reference and out[-1].cached_tokens == 0
    again = run(engine, greedy("b", PROMPT))["b"]
    assert again[-1].cached_tokens_by_tier == {"device": 64}  # the device tier still works
    failures = engine.metrics.tier_failures_total.labels(engine.model_name, "remote", "unavailable")._value.get()
    assert failures >= 1
    engine.close()
