"""The cost model's regimes, tensor parallelism and pipelined restores."""

import pytest

from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.cost import CostModel, SeqWork
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware

QWEN = load_geometry("qwen2.5-72b")


def test_one_decode_token_is_bandwidth_bound_at_weights_over_bandwidth():
    hw = load_hardware("h200")
    cost = CostModel(QWEN, hw, "fp8", "fp8").step([SeqWork(100, 101)])
    assert cost.memory_s > cost.compute_s
    expected = (QWEN.weight_bytes("fp8") + 102 * QWEN.kv_bytes_per_token("fp8")) / (4.8e12 * 0.8)
    assert cost.memory_s == pytest.approx(expected)
    assert cost.seconds == pytest.approx(expected + hw.step_overhead_s)


def test_long_prefill_is_compute_bound_and_tensor_parallelism_splits_it():
    one = CostModel(QWEN, load_hardware("h200"), "fp8", "fp8").step([SeqWork(0, 8192)])
    eight = CostModel(QWEN, load_hardware("8xh200"), "fp8", "fp8").step([SeqWork(0, 8192)])
    assert one.compute_s > one.memory_s
    assert eight.compute_s == pytest.approx(one.compute_s / 8)
    assert eight.comm_s > 0 == one.comm_s
    # Attention over the context: the second half of a prompt costs more than the first half.
    first = CostModel(QWEN, load_hardware("h200")).step([SeqWork(0, 4096)]).flops
    second = CostModel(QWEN, load_hardware("h200")).step([SeqWork(4096, 8192)]).flops
    assert second > first


def test_moe_decode_reads_only_the_experts_it_routes_to():
    dsv3 = load_geometry("deepseek-v3")
    model = CostModel(dsv3, load_hardware("8xh200"), "fp8")
    one = model.step([SeqWork(10, 11)]).bytes
    many = model.step([SeqWork(10, 11)] * 512).bytes
    assert one < 0.1 * dsv3.weight_bytes()  # 9 of 257 experts per layer
    assert many == pytest.approx(dsv3.weight_bytes() + 512 * 12 * dsv3.kv_bytes_per_token("fp8"), rel=0.01)


def test_restore_pipeline_overlaps_its_stages():
    model = CostModel(QWEN, load_hardware("8xh200"), "fp8")
    tokens = 100_000
    host_only = model.restore_seconds({Tier.HOST: tokens})
    disk_only = model.restore_seconds({Tier.DISK: tokens})
    nvme_stage = tokens * QWEN.kv_bytes_per_token("fp8") / 12e9
    assert disk_only > nvme_stage  # the slow stage plus the pipeline's fill
    assert disk_only < nvme_stage + host_only  # not the sum: the stages overlap
    assert model.restore_seconds({}) == 0.0


def test_padded_attention_charges_every_sequence_the_longest_query_and_context():
    smol = load_geometry("smollm2-135m")
    hw = load_hardware("cpu")
    exact, padded = CostModel(smol, hw, "fp32", "fp32"), CostModel(smol, hw, "fp32", "fp32", padded_attention=True)
    per_pair = smol.attention_flops_per_token(1.0)
    linear = smol.linear_flops_per_token()
    # One 512-token prefill next to seven decodes at context 520: eight padded rows of 512 queries x 528 keys.
    work = [SeqWork(0, 512)] + [SeqWork(519, 520)] * 7
    assert padded.step(work).flops == pytest.approx(519 * linear + 8 * 512 * 528 * per_pair)
    assert exact.step(work).flops == pytest.approx(519 * linear + (512 * 513 / 2 + 7 * 520) * per_pair)
    # Alone, a decode pays only for its page-rounded context.
    assert padded.step([SeqWork(519, 520)]).flops == pytest.approx(linear + 528 * per_pair)
