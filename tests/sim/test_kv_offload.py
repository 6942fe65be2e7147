"""A case's KV tier and P/D mappings: parsed into values, refused in one line naming the field, built into nodes."""

import dataclasses

import pytest

from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.measure.metrics import summarize_run
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.fleet import build_nodes
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import GB, load_hardware
from kvbench.sim.kv_offload import (
    LMCACHE_CHUNK_TOKENS,
    Connector,
    Medium,
    TierSpecError,
    check_block_tokens,
    parse_kv_offload,
    parse_pd,
)
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload


def test_the_issues_spelling_parses_to_values():
    spec = parse_kv_offload({"medium": "cpu", "connector": "vllm-native", "bytes_per_replica": 100.0e9})
    assert (spec.medium, spec.connector, spec.bytes_per_replica) == (Medium.CPU, Connector.VLLM_NATIVE, 100.0e9)
    assert spec.block_tokens_for(16) == 16  # vLLM's offloaded block defaults to the GPU block
    lm = parse_kv_offload(
        [
            {"medium": "cpu", "connector": "lmcache", "bytes_per_replica": 20e9},
            {"medium": "disk", "connector": "lmcache", "bytes_per_replica": 1.2e12, "read_gb_s": 2, "latency_ms": 1.5},
        ]
    )
    assert [t.medium for t in lm.tiers] == [Medium.CPU, Medium.DISK]
    assert lm.tiers[1].read_gb_s == 2.0 and lm.tiers[1].latency_s == pytest.approx(1.5e-3)
    assert lm.block_tokens_for(16) == LMCACHE_CHUNK_TOKENS
    pd = parse_pd({"prefill_replicas": 8, "decode_replicas": 2, "link_gbps": 400, "decode_devices": 4})
    assert (pd.prefill_replicas, pd.decode_replicas, pd.decode_devices) == (8, 2, 4)
    assert pd.link_bytes_per_s == 50e9  # 400 Gb/s


@pytest.mark.parametrize(
    "mapping, message",
    [
        ({"medium": "cpu"}, "engine.kv_offload.connector is missing; give one of vllm-native, lmcache"),
        (
            {"medium": "gpu", "connector": "lmcache", "bytes_per_replica": 1e9},
            "engine.kv_offload.medium is 'gpu'; use one of cpu, disk, remote, peer",
        ),
        ({"medium": "cpu", "connector": "lmcache"}, "engine.kv_offload.bytes_per_replica is missing"),
        ({"medium": "cpu", "connector": "lmcache", "bytes_per_replica": -1}, "bytes_per_replica: must be > 0"),
        ({"medium": "cpu", "connector": "lmcache", "bytes_per_replica": "lots"}, "bytes_per_replica: expected float"),
        (
            {"medium": "cpu", "connector": "lmcache", "bytes_per_replica": 1e9, "bandwidth": 3},
            "unknown key 'bandwidth'",
        ),
        ({"medium": "disk", "connector": "vllm-native", "bytes_per_replica": 1e9}, "use connector: lmcache"),
        ({"medium": "peer", "connector": "lmcache", "bytes_per_replica": 1e9}, "peer tier is the other replicas'"),
        (
            [
                {"medium": "cpu", "connector": "lmcache", "bytes_per_replica": 1e9},
                {"medium": "disk", "connector": "vllm-native", "bytes_per_replica": 1e9},
            ],
            "one connector",
        ),
        (
            [
                {"medium": "disk", "connector": "lmcache", "bytes_per_replica": 1e9},
                {"medium": "cpu", "connector": "lmcache", "bytes_per_replica": 1e9},
            ],
            "engine.kv_offload[1].medium is cpu",
        ),
        ([], "empty list"),
    ],
)
def test_bad_tiers_are_refused_naming_the_field(mapping, message):
    with pytest.raises(TierSpecError, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
        parse_kv_offload(mapping)
    assert "\n" not in str(caught.value)


def test_bad_pd_is_refused_naming_the_field():
    with pytest.raises(TierSpecError, match="pd.link_gbps is missing"):
        parse_pd({"prefill_replicas": 8, "decode_replicas": 2})
    with pytest.raises(TierSpecError, match="pd.decode_replicas: must be >= 1"):
        parse_pd({"prefill_replicas": 8, "decode_replicas": 0, "link_gbps": 100})


def test_vllm_offloads_whole_gpu_blocks():
    spec = parse_kv_offload({"medium": "cpu", "connector": "vllm-native", "bytes_per_replica": 1e9, "block_tokens": 24})
    with pytest.raises(TierSpecError, match="multiple of the block size 16"):
        check_block_tokens(spec, 16)
    check_block_tokens(dataclasses.replace(spec, block_tokens=32), 16)


def config(kv_offload=None, device_kv_tokens=2000) -> SimConfig:
    return SimConfig(
        load_geometry("qwen2.5-72b"),
        load_hardware("8xh200"),
        get_preset("vllm-prefix"),
        "fp8",
        "fp8",
        device_kv_tokens,
        kv_offload=kv_offload,
    )


def test_a_spec_builds_its_tiers_at_its_size_and_speed():
    spec = parse_kv_offload({"medium": "cpu", "connector": "vllm-native", "bytes_per_replica": 10e9, "read_gb_s": 20})
    cfg = config(spec)
    [node] = build_nodes(cfg)
    [tier] = node.below.tiers
    page_bytes = cfg.cost.kv_bytes_per_token * cfg.preset.page_size
    assert tier.tier == Tier.HOST and tier.capacity_pages == int(10e9 // page_bytes)
    # The spec's read speed is the host link's, per device (8 devices here).
    assert cfg.cost.link(Tier.HOST).bandwidth == 8 * 20 * GB
    assert config().cost.link(Tier.HOST).bandwidth == load_hardware("8xh200").host_bw


def test_a_cpu_tier_from_a_spec_recomputes_less_than_device_only():
    mini = load_workload("rag-chat-mini", num_sessions=12, seed=3)
    spec = parse_kv_offload({"medium": "cpu", "connector": "vllm-native", "bytes_per_replica": 100e9})
    device_only = summarize_run(simulate(mini, LoadSpec(), config()).records).overall.cache
    with_cpu = summarize_run(simulate(mini, LoadSpec(), config(spec)).records).overall.cache
    assert device_only.prefill_recompute_rate > 0.2
    assert with_cpu.prefill_recompute_rate < device_only.prefill_recompute_rate / 2
