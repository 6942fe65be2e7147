"""The rule behind max_prefill_beside_decodes `auto` (core.plans.stall_bounded_prefill): on a step cost that is a
line a + b x prefill tokens the budget is the largest that keeps a step within `factor` of a pure decode step;
on a roofline (flat while the weights' read hides the prefill, then a line) it walks the flat part and stays
within the factor; always in [1, the probe's ceiling]. The probe shape fits the step budget and the device KV."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.engines.kvengine.core.plans import PROBE_CHUNKS, ProbeShape, probe_shape, stall_bounded_prefill

shapes = st.builds(
    lambda first, extra: ProbeShape(min(64, first), first, first + extra), st.integers(1, 512), st.integers(0, 8192)
)


@given(a=st.floats(1e-4, 1.0), b=st.floats(1e-7, 1e-1), factor=st.floats(1.05, 8.0), shape=shapes)
def test_on_a_line_the_budget_is_the_largest_within_the_factor(a, b, factor, shape):
    asked: list[int] = []

    def step_s(n: int) -> float:
        asked.append(n)
        return a + b * n

    n = stall_bounded_prefill(step_s, shape, factor)
    assert 1 <= n <= shape.ceiling and all(0 <= k <= shape.ceiling for k in asked)
    slack = 1e-9 * factor * a
    if n > 1:
        assert a + b * n <= factor * a + slack  # within the factor
    if n < shape.ceiling:
        assert a + b * (n + 1) > factor * a - slack  # one more token would not be


@given(
    a=st.floats(1e-3, 1.0),
    knee=st.integers(0, 4096),
    b=st.floats(1e-7, 1e-2),
    factor=st.floats(1.05, 8.0),
    shape=shapes,
)
def test_on_a_roofline_the_flat_part_is_walked_and_the_factor_kept(a, knee, b, factor, shape):
    def step_s(n: int) -> float:  # a GPU-like step: the weights' read hides the first `knee` prefill tokens
        return a + b * max(0, n - knee)

    n = stall_bounded_prefill(step_s, shape, factor)
    assert 1 <= n <= shape.ceiling
    if n > 1:
        assert step_s(n) <= factor * a * (1 + 1e-9)
    if knee >= shape.first:  # the flat part was walked (doubling), not extrapolated
        assert n >= min(shape.ceiling, knee) // 2


def test_free_prefill_is_bounded_by_the_ceiling_alone():
    assert stall_bounded_prefill(lambda n: 0.05, ProbeShape(64, 128, 512), 2.0) == 512
    assert stall_bounded_prefill(lambda n: 0.05 - 1e-6 * n, ProbeShape(64, 128, 512), 2.0) == 512  # noise


def test_a_prefill_dearer_than_the_factor_still_gets_one_token():
    assert stall_bounded_prefill(lambda n: 0.01 + 10.0 * n, ProbeShape(16, 16, 512), 1.5) == 1  # never starved


def test_a_factor_of_one_or_less_is_refused():
    with pytest.raises(ValueError, match="factor 1 must be > 1"):
        stall_bounded_prefill(lambda n: 1.0, ProbeShape(1, 1, 1), 1.0)


@given(step=st.integers(1, 4096), capacity=st.integers(6, 1 << 20))
def test_the_probe_fits_the_step_budget_and_the_kv(step, capacity):
    shape = probe_shape(step, capacity)
    assert 1 <= shape.context <= shape.first <= shape.ceiling <= step
    assert shape.context + PROBE_CHUNKS * shape.ceiling <= capacity  # the decode and every chunk are resident
