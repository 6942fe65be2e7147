"""Capacity arithmetic on hand-checked cases, including the article's own numbers."""

import pytest

from kvbench.sim.capacity import TIB, capacity_report, kv_reduction
from kvbench.sim.geometry import ModelConfigError, geometry_from_config, load_geometry
from kvbench.sim.hardware import (
    GB,
    NETWORK,
    NVME,
    PCIE,
    Device,
    Hardware,
    load_hardware,
)


def test_dense_70b_at_128k_by_256_sessions_needs_10_tib_of_fp16_kv():
    llama = load_geometry("llama-3.3-70b")
    # 80 layers x (K + V) x 8 KV heads x 128 dims x 2 bytes = 327,680 bytes per token.
    assert llama.kv_bytes_per_token("fp16") == 80 * 2 * 8 * 128 * 2 == 327_680
    report = capacity_report(llama, load_hardware("8xh200"), "fp16", 128 * 1024, 256)
    assert report.kv_bytes_per_session == 40 * 2**30  # 40 GiB per 128K-token session
    assert report.kv_bytes_total == pytest.approx(10 * TIB)  # ~10 TiB, not ~1 TB
    assert not report.fits_on_device
    fp8 = capacity_report(llama, load_hardware("8xh200"), "fp8", 128 * 1024, 256)
    assert fp8.kv_bytes_total == report.kv_bytes_total / 2


def test_mla_stores_about_79_percent_less_than_the_dense_70b():
    deepseek = load_geometry("deepseek-v3")
    # 61 layers x (512 latent + 64 rope) x 2 bytes = 70,272 bytes per token.
    assert deepseek.kv_bytes_per_token("bf16") == 61 * 576 * 2 == 70_272
    assert kv_reduction(deepseek, load_geometry("llama-3.3-70b")) == pytest.approx(1 - 70_272 / 327_680)
    assert 0.78 < kv_reduction(deepseek, load_geometry("llama-3.3-70b")) < 0.80


@pytest.mark.parametrize(
    "name, total_b, active_b",
    [
        ("llama-3.3-70b", 70.6, 70.6),
        ("qwen2.5-72b", 72.7, 72.7),
        ("mixtral-8x22b", 140.6, 39.0),
        ("deepseek-v3", 671.0, 37.0),
        ("qwen3-235b-a22b", 235.1, 22.0),
        ("smollm2-135m", 0.135, 0.135),
    ],
)
def test_parameter_counts_match_the_published_sizes(name, total_b, active_b):
    g = load_geometry(name)
    assert g.num_params / 1e9 == pytest.approx(total_b, rel=0.02)
    # Active params count the lm_head but not the input embedding (a lookup); published "active" counts
    # include embeddings, so allow a few percent.
    assert g.active_params / 1e9 == pytest.approx(active_b, rel=0.06)


def test_sessions_that_fit_and_restore_times_on_a_hand_sized_node():
    device = Device("toy", memory_bytes=100 * GB, memory_bw=1e12, flops_bf16=1e15, flops_fp8=2e15)
    node = Hardware(
        "2xtoy",
        device,
        2,
        PCIE,
        NVME,
        NETWORK,
        host_memory_bytes=400 * GB,
        disk_bytes=4000 * GB,
        memory_fraction=0.9,
        activation_reserve_bytes=10 * GB,
    )
    small = geometry_from_config(
        {
            "hidden_size": 1024,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "num_hidden_layers": 10,
            "intermediate_size": 4096,
            "vocab_size": 1000,
            "head_dim": 128,
        },
        "toy",
    )
    # 10 x 2 x 2 x 128 x 2 B = 10,240 B/token; 10,000-token sessions = 102.4 MB each.
    report = capacity_report(small, node, "fp16", 10_000, 5000)
    assert report.kv_bytes_per_session == 102_400_000
    # Device budget: 2 x (90 - 10) GB - weights.
    assert report.device.bytes == pytest.approx(160e9 - report.weight_bytes)
    assert report.device.sessions == int((160e9 - report.weight_bytes) // 102_400_000)
    host = report.tiers[1]
    assert host.sessions == 3906  # 400 GB // 102.4 MB
    # Host -> device over 2 PCIe links of 40 GB/s: 102.4 MB / 80 GB/s = 1.28 ms, plus the link latency.
    assert host.restore_s == pytest.approx(102.4e6 / 80e9 + PCIE.latency_s)
    # Disk goes through host: the 12 GB/s NVMe stage dominates, plus one pipelined chunk of the PCIe stage.
    disk = report.tiers[2]
    assert 102.4e6 / 12e9 < disk.restore_s < 102.4e6 / 12e9 + 102.4e6 / 80e9


def test_bad_input_names_the_field():
    with pytest.raises(ModelConfigError, match="hidden_size"):
        geometry_from_config({"num_attention_heads": 8}, "broken")
    with pytest.raises(ModelConfigError, match="not a shipped model"):
        load_geometry("no-such-model")
    with pytest.raises(ValueError, match="dtype 'fp7'"):
        load_geometry("qwen2.5-72b").kv_bytes_per_token("fp7")
