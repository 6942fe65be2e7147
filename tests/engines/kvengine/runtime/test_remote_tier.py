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
    a.close()  # its pages are published (publishing runs beside the steps; under load it can lag b's lookup)
    second = run(b, greedy("b", PROMPT))["b"]
    assert first[-1].cached_tokens == 0
    assert second[-1].cached_tokens_by_tier == {"remote": 64}
    assert tokens(second) == tokens(first)
    b.close()


def test_another_kv_dtype_or_model_never_hits_the_shared_pages(loaded, redis):
    run(make_engine(loaded, remote_url=redis.url), greedy("a", PROMPT))
    fp8 = run(make_engine(loaded, remote_url=redis.url, kv_dtype="fp8_e4m3"), greedy("b", PROMPT))["b"]
    other = run(make_engine(tiny_loaded_model(seed=4), remote_url=redis.url), greedy("c", PROMPT))["c"]
    assert fp8[-1].cached_tokens == 0 and other[-1].cached_tokens == 0


def test_a_second_engine_process_hits_what_this_one_computed(loaded, redis):
    engine = make_engine(loaded, remote_url=redis.url)
    run(engine, greedy("a", PROMPT))
    engine.close()  # every page published
    script = textwrap.dedent(f"""
        from kvbench.engines.kvengine.settings.config import EngineConfig
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


# --- authenticated records (issue 28) ---------------------------------------------------------------------


def _page_keys(engine, prompt):
    from kvbench.engines.kvengine.core.content_keys import page_keys
    from kvbench.engines.kvengine.core.namespaces import namespace_for

    return page_keys(engine.key_salt, namespace_for("default", shareable=False, strict=True), prompt, 16)


def _failures(engine, reason: str) -> float:
    return engine.metrics.tier_failures_total.labels(engine.model_name, "remote", reason)._value.get()


def test_a_forged_record_in_the_shared_redis_is_a_counted_miss_and_the_output_is_unchanged(loaded, redis):
    """An attacker who can write to Redis copies a real record's header, writes a random payload and fixes
    up every checksum it can compute; before the MAC this was served as a remote hit and changed the output."""
    import redis as redis_client

    secret = "deployment-secret"
    reference = tokens(run(make_engine(loaded), greedy("ref", PROMPT))["ref"])
    writer = make_engine(loaded, remote_url=redis.url, tier_secret=secret)
    run(writer, greedy("a", PROMPT))
    writer.close()  # every page published
    client = redis_client.Redis.from_url(redis.url)
    names = [writer.offload.remote.prefix + key for key in _page_keys(writer, PROMPT)[:4]]
    records = [client.get(name) for name in names]
    assert all(records), "the writer published every full prompt page"
    import random
    import struct
    import zlib

    rng = random.Random(28)
    for name, record in zip(names, records):
        header_size = 48 if record[:4] == b"KVP2" else 60  # KVP2 (before the MAC): its header ends in a CRC-32
        header = bytearray(record[:header_size])
        payload = rng.randbytes(len(record) - header_size)
        if record[:4] == b"KVP2":
            struct.pack_into("<I", header, header_size - 4, zlib.crc32(payload))
        client.set(name, bytes(header) + payload)
    reader = make_engine(loaded, remote_url=redis.url, tier_secret=secret)
    out = run(reader, greedy("b", PROMPT))["b"]
    assert tokens(out) == reference
    assert out[-1].cached_tokens == 0 and not (out[-1].cached_tokens_by_tier or {}).get("remote")
    assert _failures(reader, "forged") >= 1
    reader.close()


def test_records_written_under_a_rotated_secret_are_misses(loaded, redis):
    old = make_engine(loaded, remote_url=redis.url, tier_secret="old-secret")
    first = run(old, greedy("a", PROMPT))["a"]
    old.close()  # every page published
    same = run(make_engine(loaded, remote_url=redis.url, tier_secret="old-secret"), greedy("s", PROMPT))["s"]
    assert same[-1].cached_tokens_by_tier == {"remote": 64}  # the secret itself does not make misses
    rotated = make_engine(loaded, remote_url=redis.url, tier_secret="new-secret")
    out = run(rotated, greedy("b", PROMPT))["b"]
    assert tokens(out) == tokens(first)
    assert out[-1].cached_tokens == 0
    assert _failures(rotated, "forged") >= 1
    rotated.close()


def test_a_remote_tier_without_a_secret_warns_once_and_never_logs_keys(loaded, redis, caplog):
    with caplog.at_level("WARNING"):
        engine = make_engine(loaded, remote_url=redis.url)
        run(engine, greedy("a", PROMPT))
    warnings = [r for r in caplog.records if "tier secret" in r.getMessage()]
    assert len(warnings) == 1
    keys = _page_keys(engine, PROMPT)
    assert not any(key in r.getMessage() for r in caplog.records for key in keys)
    with caplog.at_level("WARNING"):
        caplog.clear()
        make_engine(loaded, remote_url=redis.url, tier_secret="set").close()
    assert not [r for r in caplog.records if "tier secret" in r.getMessage()]
    engine.close()
