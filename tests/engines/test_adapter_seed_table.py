"""ci/seed-table.yaml, the article's four-row experiment, is a valid `kvbench run` config whose every engine row
builds and whose generated commands the reference help texts of every targeted version accept (checked offline: it needs 8xH200 to run)."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvbench.engines.launch import command_problems, respell
from kvbench.engines.lmcache import LMCacheAdapter
from kvbench.engines.sglang import SGLangAdapter
from kvbench.engines.vllm import VLLMAdapter
from kvbench.harness.config import load_config_file

ROOT = Path(__file__).resolve().parents[2]
from tests.paths import REFERENCE  # noqa: E402

ADAPTERS = {"vllm": VLLMAdapter, "sglang": SGLangAdapter, "lmcache": LMCacheAdapter}


def test_seed_table_has_the_article_rows_and_every_command_is_accepted(tmp_path):
    config = load_config_file(ROOT / "ci" / "seed-table.yaml")
    assert [engine.label for engine in config.engines] == [
        "vllm-prefix-caching",
        "sglang-radix",
        "vllm-lmcache-local-cpu-nvme",
        "vllm-lmcache-distributed-shared",
        "kvengine",
    ]  # its memory budget is checked in tests/engines/kvengine/runtime/test_memory_budget.py
    assert [spec.name for spec in config.workloads] == ["rag-chat"]
    for engine in config.engines[:4]:
        adapter = ADAPTERS[engine.engine](engine.settings, tmp_path / engine.label)
        plan = adapter.server.plan
        for version, file_name in adapter.reference_help.items():  # every version the adapter targets
            text = (REFERENCE / file_name).read_text()
            assert command_problems(respell(plan.command, text, plan.spellings), text) == [], (engine.label, version)
        text = " ".join(plan.command)
        assert "Qwen/Qwen2.5-72B-Instruct" in text and "--quantization fp8" in text
        assert "--tensor-parallel-size 8" in text or "--tp-size 8" in text
    local, shared = (ADAPTERS["lmcache"](e.settings, tmp_path / e.label) for e in config.engines[2:4])
    assert yaml.safe_load(local.server.plan.files["lmcache.yaml"])["local_disk"] == "file:///mnt/nvme/kvbench-lmcache/"
    assert yaml.safe_load(shared.server.plan.files["lmcache.yaml"])["remote_url"] == "redis://127.0.0.1:6379"
