"""Throughput from per-repetition rates (verdicts/rates.py): Welch's t interval on the ratio of the means, worked
by hand; too few repetitions fall back to the request bootstrap."""

from __future__ import annotations

import pytest

from kvbench.verdicts.gate_metrics import PERF_METRICS
from kvbench.verdicts.rates import rate_interval, rate_mde
from kvbench.verdicts.verdict import Verdict, judge

SPEC = PERF_METRICS["output_tok_s"].spec


def test_a_ten_percent_drop_over_three_repetitions_a_side_is_a_regression_worked_by_hand():
    # Both sides: a mean and a 2% relative spread (variance 4 on 100, 3.24 on 90): the ratio is 0.9 exactly,
    # each mean's squared relative error 4 / 3 / 100^2, Welch's degrees of freedom (2a)^2 / (2 a^2 / 2) = 4,
    # t(0.995, 4) = 4.604, standard error 0.9 x sqrt(2 x 4 / 30000) = 0.014697.
    interval = rate_interval([100.0, 102.0, 98.0], [90.0, 91.8, 88.2], confidence=0.99)
    assert interval.standard_error == pytest.approx(0.014697, abs=1e-6)
    assert (interval.low, interval.high) == pytest.approx((-0.1 - 0.067664, -0.1 + 0.067664), abs=1e-5)
    assert judge(SPEC, -0.1, (interval.low, interval.high)) is Verdict.REGRESSION
    assert rate_mde(SPEC, interval) == pytest.approx(0.067664 + 0.8416 * 0.014697, abs=1e-5)


def test_identical_rates_are_no_change_and_noise_wider_than_the_change_is_inconclusive():
    same = rate_interval([100.0, 100.5, 99.5], [99.5, 100.0, 100.5], confidence=0.99)
    assert -SPEC.tolerance < same.low < 0 < same.high < SPEC.tolerance
    assert judge(SPEC, 0.0, (same.low, same.high)) is Verdict.NO_CHANGE
    noisy = rate_interval([100.0, 120.0, 80.0], [90.0, 108.0, 72.0], confidence=0.99)
    assert noisy.low < 0 < noisy.high and judge(SPEC, -0.1, (noisy.low, noisy.high)) is Verdict.INCONCLUSIVE


def test_one_repetition_a_side_or_no_throughput_gives_no_rate_interval():
    assert rate_interval([100.0], [90.0, 91.0], 0.99) is None
    assert rate_interval([100.0, 101.0], [0.0, 0.0], 0.99) is None
    steady = rate_interval([100.0, 100.0], [90.0, 90.0], 0.99)
    assert (steady.low, steady.high, steady.standard_error) == pytest.approx((-0.1, -0.1, 0.0))
