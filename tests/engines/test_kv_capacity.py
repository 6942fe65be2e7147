"""The KV capacity an engine states on /metrics, read as each engine writes it (not the setting it was given)."""

from __future__ import annotations

from kvbench.engines.kv_capacity import KVCapacity, kv_capacity
from kvbench.engines.kvengine.runtime.metrics import EngineMetrics
from kvbench.engines.prometheus import parse_samples

# vLLM 0.32's info gauge (v1/metrics/loggers.py log_metrics_info: every CacheConfig field a label, value 1).
VLLM = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",kv_cache_size_tokens="%s",num_cpu_blocks="None",num_gpu_blocks="70"} 1.0
"""
SGLANG = """# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m",pp_rank="0",tp_rank="0"} 471258.0
sglang:max_total_num_tokens{model_name="m",pp_rank="0",tp_rank="1"} 471258.0
"""


def test_our_engine_states_tokens_and_bytes():
    metrics = EngineMetrics("tiny")
    metrics.capacity(2176, 9216)
    assert kv_capacity(parse_samples(metrics.exposition().decode())) == KVCapacity(
        2176, 2176 * 9216, "kvbench:kv_capacity_tokens"
    )


def test_vllm_states_tokens_in_its_cache_config_info():
    assert kv_capacity(parse_samples(VLLM % "8960")) == KVCapacity(8960, None, "vllm:cache_config_info")
    # A version without kv_cache_size_tokens: num_gpu_blocks x block_size.
    assert kv_capacity(parse_samples(VLLM % "None")).tokens == 70 * 128


def test_sglang_states_tokens_once_per_rank():
    assert kv_capacity(parse_samples(SGLANG)) == KVCapacity(471258, None, "sglang:max_total_num_tokens")


def test_an_engine_that_states_nothing_has_no_capacity():
    assert kv_capacity(None) is None
    assert kv_capacity(parse_samples("# TYPE x gauge\nx 1\n")) is None
