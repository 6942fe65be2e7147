"""The simulator refuses, from its estimate, a fleet this machine cannot hold (issue 46: `--nodes 100000` was
accepted, took 15.5 GB and met the OOM killer); the estimate counts what is allocated up front."""

from __future__ import annotations

import dataclasses
import tracemalloc

import pytest

from kvbench.sim.config import SIM_DEVICE_PAGE_BYTES, SimConfig
from kvbench.sim.engine import build_nodes
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset

GIB = 1 << 30


def config(nodes: int, device_kv_tokens: int | None = None) -> SimConfig:
    preset = dataclasses.replace(get_preset("vllm-prefix"), num_nodes=nodes)
    return SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), preset, "fp8", device_kv_tokens=device_kv_tokens
    )


def test_a_fleet_past_the_available_memory_is_refused_naming_the_estimate():
    big = config(100_000)
    with pytest.raises(
        ValueError, match=r"100,000 nodes x [\d,]+ device pages and 256 sessions need about [\d,.]+ GiB"
    ):
        big.check_memory(256, 16 * GIB)
    config(2).check_memory(256, 16 * GIB)  # two nodes fit
    assert config(4).memory_bytes(256) > config(2).memory_bytes(256) > config(2).memory_bytes(0)
    small = config(100_000, device_kv_tokens=16 * 64)  # 64 pages a node: the same fleet fits
    small.check_memory(256, 16 * GIB)


def test_the_estimate_covers_the_page_pools_built_up_front():
    fleet = config(3, device_kv_tokens=16 * 20_000)
    tracemalloc.start()
    try:
        nodes = build_nodes(fleet)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(nodes) == 3
    counted = 3 * fleet.device_pages() * SIM_DEVICE_PAGE_BYTES  # what the estimate counts for these pools
    assert 0.8 * counted <= held <= 1.25 * counted
