"""Steps priced from aiconfigurator's measured kernels, against a hand lookup of the shipped table rows."""

import csv
import gzip
import math

import pytest

from kvbench.sim.config import SimConfig
from kvbench.sim.cost import CostModel, SeqWork
from kvbench.sim.geometry import geometry_from_config, load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.kernel_data_files import load_kernel_tables, step_kernels, table_path
from kvbench.sim.presets import get_preset

# A 2-layer model whose every GEMM lies on the tables' measured (n, k) grid at TP 1: qkv 6144 x 4096, o and
# down 4096 x 4096, gate_up 8192 x 4096, lm_head 65536 x 4096; attention 32 heads, 8 KV heads of 128.
GRID_MODEL = geometry_from_config(
    {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 2,
        "intermediate_size": 4096,
        "vocab_size": 65536,
    },
    "grid-model",
)


def rows(table: str, **match) -> list[dict]:
    """The rows of a shipped h200 vLLM table whose columns equal `match` (read by hand, not by the code)."""
    with gzip.open(table_path("h200_sxm", "vllm", table), "rt") as f:
        return [r for r in csv.DictReader(f) if all(r[k] == str(v) for k, v in match.items())]


def latency_s(table: str, **match) -> float:
    found = rows(table, **match)
    assert len(found) == 1, f"{table} {match}: {len(found)} rows"
    return float(found[0]["latency"]) / 1e3


def gemm_s(m: int, n: int, k: int) -> float:
    return latency_s("gemm", gemm_dtype="bfloat16", m=m, n=n, k=k)


def attention_s(table: str, batch: int, length: int) -> float:
    key = {"step": length} if table == "generation_attention" else {"isl": length, "step": 0}
    return latency_s(
        table,
        batch_size=batch,
        num_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        kv_cache_dtype="bfloat16",
        window_size=0,
        **key,
    )


def layer_gemms_s(m: int) -> float:
    return gemm_s(m, 6144, 4096) + gemm_s(m, 4096, 4096) + gemm_s(m, 8192, 4096) + gemm_s(m, 4096, 4096)


def test_a_decode_step_is_the_sum_of_its_measured_kernels():
    hw = load_hardware("h200")
    cost = SimConfig(GRID_MODEL, hw, get_preset("vllm-prefix"), "bf16").cost
    assert cost.kernels is not None
    # 32 decodes at context 4095 (starts 4094): a measured batch and a measured context.
    step = cost.step((), [4094] * 32)
    expected = (
        2 * layer_gemms_s(32)
        + gemm_s(32, 65536, 4096)
        + 2 * attention_s("generation_attention", 32, 4095)
        + hw.step_overhead_s
    )
    assert step.seconds == pytest.approx(expected, rel=1e-9)
    # A run of decode steps prices each step as `step` does, to the bit (each one position further).
    run = cost.decode_seconds(32, 32 * 4094, 4094, steps=3)
    assert run == [cost.step((), [4094 + j] * 32).seconds for j in range(3)] and run[0] == step.seconds


def test_a_prefill_step_is_priced_per_kernel_and_a_cached_prefix_only_adds_its_chunk():
    hw = load_hardware("h200")
    cost = SimConfig(GRID_MODEL, hw, get_preset("vllm-prefix"), "bf16").cost
    whole = cost.step([SeqWork(0, 4096)]).seconds
    expected = (
        2 * layer_gemms_s(4096)
        + gemm_s(1, 65536, 4096)
        + 2 * attention_s("context_attention", 1, 4096)
        + hw.step_overhead_s
    )
    assert whole == pytest.approx(expected, rel=1e-9)
    # The second 2048 tokens after a cached 2048: prefill(4096) - prefill(2048) of the measured curve.
    chunk = cost.step([SeqWork(2048, 4096)]).seconds
    attention = attention_s("context_attention", 1, 4096) - attention_s("context_attention", 1, 2048)
    assert chunk == pytest.approx(
        2 * layer_gemms_s(2048) + gemm_s(1, 65536, 4096) + 2 * attention + hw.step_overhead_s, rel=1e-9
    )


def test_a_prefill_past_the_measured_lengths_is_quadratic_in_its_attention():
    hw = load_hardware("h200")
    cost = SimConfig(GRID_MODEL, hw, get_preset("vllm-prefix"), "bf16").cost
    last = attention_s("context_attention", 1, 16384)  # the tables' longest measured prompt
    assert not rows("context_attention", batch_size=1, isl=32768, num_heads=32, num_key_value_heads=8)
    # 32K tokens: twice the length, four times the attention of the 16K row (not the line through 12K-16K).
    attention = cost.kernels.prefill_seconds(0, 32768)
    assert attention == pytest.approx(2 * 4 * last, rel=1e-12)
    line = last + (last - attention_s("context_attention", 1, 12288)) * 4
    assert 2 * line < 0.8 * attention
    # A 16K chunk after a cached 16K adds prefill(32K) - prefill(16K): three times the first 16K's.
    assert cost.kernels.prefill_seconds(16384, 32768) == pytest.approx(2 * 3 * last, rel=1e-12)


def test_a_gemm_between_measured_shapes_is_interpolated_per_weight_element_in_log_n():
    tables = load_kernel_tables("h200", "vllm")
    lo, hi = gemm_s(32, 1024, 8192), gemm_s(32, 1536, 8192)
    w = math.log(1280 / 1024) / math.log(1536 / 1024)
    expected = (1 - w) * lo * 1280 / 1024 + w * hi * 1280 / 1536
    assert tables.gemm_curve("bfloat16", 1280, 8192).at(32) == pytest.approx(expected, rel=1e-12)


def test_fp8_kv_decode_is_slower_at_short_contexts_and_faster_at_long_ones():
    # Qwen3-32B on one H200: 64 heads, 8 KV heads of 128; batch 1, the tables' measured contexts.
    g = load_geometry("qwen3-32b")
    bf16, fp8 = (SimConfig(g, load_hardware("h200"), get_preset("vllm-prefix"), kv).cost for kv in ("bf16", "fp8"))
    short, long = [2046], [32766]
    assert fp8.step((), short).seconds > bf16.step((), short).seconds
    assert fp8.step((), long).seconds < bf16.step((), long).seconds
    assert fp8.step([SeqWork(0, 8192)]).seconds != bf16.step([SeqWork(0, 8192)]).seconds  # TTFT differs too


def test_the_roofline_stays_where_the_tables_do_not_reach():
    assert step_kernels(load_geometry("deepseek-v3"), "h200", 8, "vllm", "bf16", None) is None  # MLA
    assert load_kernel_tables("cpu", "vllm") is None
    assert SimConfig(GRID_MODEL, load_hardware("h200"), get_preset("kvengine-tiers"), "bf16").cost.kernels is None
    roofline = CostModel(GRID_MODEL, load_hardware("h200"), "bf16")
    assert roofline.kernels is None and roofline.step((), [100]).seconds > 0


def test_the_assumptions_line_names_what_priced_the_steps():
    hw = load_hardware("h200")
    measured = SimConfig(GRID_MODEL, hw, get_preset("vllm-prefix"), "bf16").cost.pricing
    assert measured == "measured vllm kernels on h200_sxm"
    line = hw.assumptions(measured)
    assert "measured vllm kernels on h200_sxm" in line and "efficiencies" not in line
    assert line.startswith("assumption:") and "step overhead 2.0 ms" in line  # the overhead is not fitted here
    roofline = hw.assumptions()
    assert "roofline" in roofline and "FLOP/s 0.50 of peak" in roofline
