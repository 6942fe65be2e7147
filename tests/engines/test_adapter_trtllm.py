"""The TensorRT-LLM adapter offline: its options YAML (KvCacheConfig) and its trtllm-serve command. No reference
--help is stored, so the command is checked against the flags this adapter was written against (SERVE_FLAGS, from
TensorRT-LLM 1.x's serve.py); a launch checks the installed `trtllm-serve --help` as well."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvbench.engines.launch import command_flags
from kvbench.engines.trtllm import SERVE_FLAGS, TRTLLMAdapter
from kvbench.settings import SettingsError


def _adapter(tmp_path: Path, **settings) -> TRTLLMAdapter:
    return TRTLLMAdapter({"model": "/models/any", "port": 8126, **settings}, tmp_path)


def test_options_yaml_carries_the_kv_cache_config_and_the_metric_switches(tmp_path):
    adapter = _adapter(tmp_path, kv_dtype="fp8", block_reuse=True, host_cache_gib=64, free_gpu_memory_fraction=0.85,
                       tokens_per_block=16, extra_options={"kv_cache_config": {"enable_partial_reuse": False},
                                                           "max_beam_width": 1})
    options = yaml.safe_load(adapter.server.plan.files["trtllm-options.yaml"])
    assert options == {
        "kv_cache_config": {"dtype": "fp8", "enable_block_reuse": True, "host_cache_size": 64 * 2**30,
                            "free_gpu_memory_fraction": 0.85, "tokens_per_block": 16, "enable_partial_reuse": False},
        "return_perf_metrics": True, "enable_iter_perf_stats": True, "max_beam_width": 1,
    }


def test_command_uses_only_known_flags_and_points_at_the_options_file(tmp_path):
    plan = _adapter(tmp_path, tp_size=8, max_seq_len=16384, max_num_tokens=8192, max_batch_size=64).server.plan
    assert plan.command[:2] == ("trtllm-serve", "/models/any")
    assert set(command_flags(plan.command)) <= SERVE_FLAGS
    text = " ".join(plan.command)
    assert "--tp_size 8" in text and "--max_seq_len 16384" in text and "--backend pytorch" in text
    assert plan.command[plan.command.index("--extra_llm_api_options") + 1] == str((tmp_path / "trtllm-options.yaml").resolve())
    assert plan.metrics_path == "/prometheus/metrics" and plan.help_command == ("trtllm-serve", "--help")


def test_cache_reset_only_by_restart(tmp_path):
    assert _adapter(tmp_path).capabilities.cache_reset is False
    assert _adapter(tmp_path).reset_cache() is False
    assert _adapter(tmp_path, restart_to_reset=True).capabilities.cache_reset is True


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(SettingsError, match="kv_dtype 'fp8_e5m2' is not one of auto, fp8, nvfp4"):
        _adapter(tmp_path, kv_dtype="fp8_e5m2")
    with pytest.raises(SettingsError, match=r"unknown key 'host_cache_size' \(did you mean 'host_cache_gib'"):
        _adapter(tmp_path, host_cache_size=10)
