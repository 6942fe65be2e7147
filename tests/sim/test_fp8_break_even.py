"""The FP8 break-even: where FP8's line (larger intercept, smaller slope) crosses BF16's."""

import pytest

from kvbench.sim.capacity import capacity_report, fp8_break_even
from kvbench.sim.fp8_break_even import BreakEven, Line, break_even, crossing, fit_line
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware


def test_the_break_even_from_a_given_intercept_and_slope():
    bf16 = Line(intercept_s=10e-6, slope_s=1.0e-9)  # 10 us + 1 us per 1K tokens
    fp8 = Line(intercept_s=11e-6, slope_s=0.75e-9)  # 1 us more per step, a quarter less per token
    assert break_even(bf16, fp8) == pytest.approx(4000)  # 1 us / 0.25 ns per token
    assert fp8.at(3000) > bf16.at(3000) and fp8.at(5000) < bf16.at(5000)
    assert break_even(bf16, Line(9e-6, 0.75e-9)) == 0.0  # cheaper per step too: faster at every context
    assert break_even(bf16, Line(11e-6, 1.0e-9)) is None  # no saving per token: never faster
    assert break_even(bf16, Line(9e-6, 1.0e-9)) == 0.0


def test_lines_fitted_to_points_give_their_crossing():
    contexts = [1000, 2000, 4000, 8000]
    line = BreakEven.of(1, contexts, [10e-6 + 1e-9 * c for c in contexts], [12e-6 + 0.5e-9 * c for c in contexts])
    assert line.context == pytest.approx(4000)
    assert line.bf16.intercept_s == pytest.approx(10e-6) and line.fp8.slope_s == pytest.approx(0.5e-9)
    assert "past 4,000 tokens" in line.describe()
    assert fit_line([0, 1], [1.0, 3.0]) == Line(pytest.approx(1.0), pytest.approx(2.0))


def test_capacity_reports_where_fp8_becomes_faster_from_the_measured_kernels():
    g, hw = load_geometry("qwen3-32b"), load_hardware("h200")
    one, many = fp8_break_even(g, hw, batches=(1, 32))
    # vLLM's FA3 on an H200 (64 heads, 8 KV heads at TP 1): FP8 costs more per step and less per token.
    assert one.fp8.intercept_s > one.bf16.intercept_s and one.fp8.slope_s < one.bf16.slope_s
    assert 1000 < one.context < 32768
    assert capacity_report(g, hw, "fp8", 8192, 4).fp8_break_even == (one, many)
    assert fp8_break_even(g, load_hardware("cpu")) == ()


def test_the_crossing_of_priced_rows_is_linear_between_the_two_around_it():
    # Rows priced from a given intercept and slope each: the crossing is the lines' own break-even.
    bf16, fp8 = Line(10e-6, 1.0e-9), Line(12e-6, 0.5e-9)
    contexts = [1023, 2047, 4095, 8191, 16383]
    at = crossing(contexts, [bf16.at(c) for c in contexts], [fp8.at(c) for c in contexts])
    assert at == pytest.approx(break_even(bf16, fp8)) == pytest.approx(4000)
    # Measured rows that are not a line: FP8 2 us slower at 8K, 6 us faster at 16K -> a quarter of the way.
    assert crossing([8192, 16384], [20e-6, 40e-6], [22e-6, 34e-6]) == pytest.approx(8192 + 8192 / 4)
    assert crossing([1, 2], [2.0, 3.0], [1.0, 1.0]) == 0.0  # faster from the first row
    assert crossing([1, 2], [1.0, 2.0], [3.0, 2.5]) is None  # slower at every row


def test_the_h100_break_even_of_llama_8b_is_within_1_5x_of_the_vllm_blog():
    # vLLM blog "The State of FP8 KV-Cache and Attention Quantization in vLLM" (2026-04-22): Llama-3.1-8B on
    # Hopper with FA3, FP8's ITL slope 54% of BF16's, break-even at ~7k tokens. The tables price it later,
    # at the 8K-16K rows' crossing (their FP8 kernel is 0.8 us slower at 8K and 13 us faster at 16K).
    one = fp8_break_even(load_geometry("llama-3.1-8b"), load_hardware("h100"), batches=(1,))[0]
    assert 8191 < one.context < 16383
    assert 1 / 1.5 < one.context / 7000 < 1.5
