"""The simulator's fast-forward (runs of pure decode steps in one pass, `SimNode.fast_forward`) changes no
record: with it off, every step goes through schedule/postprocess one at a time, and the record streams and
per-node step counts are the same; with it on, it does run most steps."""

import dataclasses
import gc

import pytest

from kvbench.measure.schedule import LoadSpec
from kvbench.sim.cost import CostModel
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload


@pytest.fixture(scope="module")
def mini():
    return load_workload("rag-chat-mini", num_sessions=16, seed=5)


@pytest.mark.parametrize(
    "preset, device_kv_tokens, load",
    [
        ("vllm-prefix", None, LoadSpec()),
        # A small device cache at a high rate: decodes evict cached pages, and some steps preempt.
        ("vllm-prefix", 2_200, LoadSpec(rate=50.0)),
        ("sglang-radix", 2_200, LoadSpec(rate=50.0)),
        ("lmcache-shared", 2_200, LoadSpec(rate=50.0)),  # two nodes (each one's run ends at the other's next step)
        ("vllm-prefix", 4_000, LoadSpec(concurrency=4)),  # a closed loop: a finish queues the session's next turn
    ],
)
def test_fast_forward_gives_the_records_of_stepping_one_by_one(mini, preset, device_kv_tokens, load):
    config = SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset(preset), "fp8", "fp8", device_kv_tokens
    )
    fast = simulate(mini, load, config)
    slow = simulate(mini, load, dataclasses.replace(config, decode_runs=False))
    assert [r.to_json() for r in fast.records] == [r.to_json() for r in slow.records]
    assert all(r.ok for r in fast.records)
    assert [(n["steps"], n["busy_s"], n["preempted"]) for n in fast.nodes] == [
        (n["steps"], n["busy_s"], n["preempted"]) for n in slow.nodes
    ]
    assert all(n["fast_forwarded"] == 0 for n in slow.nodes)
    steps, skipped = sum(n["steps"] for n in fast.nodes), sum(n["fast_forwarded"] for n in fast.nodes)
    assert skipped > steps / 5, f"only {skipped} of {steps} steps ran in one pass"
    if device_kv_tokens == 2_200 and preset != "lmcache-shared":
        assert sum(n["preempted"] for n in fast.nodes) > 0, "the small cache is meant to preempt"


def test_the_ttl_tiers_are_never_fast_forwarded(mini):
    """Our engine's TTL tiers act at every step's fixed points (evicted pages go down): no step is skipped."""
    config = SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset("kvengine-tiers"), "fp8", "fp8", 2_200
    )
    result = simulate(mini, LoadSpec(rate=50.0), config)
    assert all(n["fast_forwarded"] == 0 for n in result.nodes) and all(r.ok for r in result.records)


def test_a_run_step_costs_what_a_step_of_those_decodes_costs():
    cost = CostModel(load_geometry("qwen2.5-72b"), load_hardware("8xh200"), "fp8", "fp8")
    padded = dataclasses.replace(cost, padded_attention=True)
    moe = CostModel(load_geometry("qwen3-235b-a22b"), load_hardware("8xh200"), "fp8", "fp8")
    cpu = CostModel(load_geometry("tiny-random"), load_hardware("cpu"))  # no overlap: compute + memory
    for model in (cost, padded, moe, cpu):
        for starts in ([5], [100, 2_000, 37], list(range(1_000, 60_000, 250))):
            run = model.decode_seconds(len(starts), sum(starts), max(starts), steps=40)
            assert run == [model.step((), [s + j for s in starts]).seconds for j in range(40)]
    assert padded.decode_seconds(3, 300, 200) != cost.decode_seconds(3, 300, 200)


def test_simulate_leaves_the_garbage_collector_as_it_found_it(mini):
    config = SimConfig(load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset("vllm-prefix"), "fp8", "fp8")
    assert gc.isenabled()
    simulate(mini, LoadSpec(num_requests=3), config)
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(mini, LoadSpec(num_requests=3), config)
        assert not gc.isenabled()
    finally:
        gc.enable()
