"""Throughput from per-repetition rates (verdicts/rates.py): Student's t interval on the ratio of the means, worked
by hand; too few repetitions fall back to the request bootstrap."""

from __future__ import annotations

import pytest

from kvbench.verdicts.gate_metrics import PERF_METRICS
from kvbench.verdicts.rates import rate_interval, rate_mde
from kvbench.verdicts.verdict import Verdict, judge

SPEC = PERF_METRICS["output_tok_s"].spec


def test_a_ten_percent_drop_over_three_repetitions_a_side_is_a_regression_worked_by_hand():
    # Both sides: a mean and a 2% relative spread (variance 4 on 100, 3.24 on 90): the ratio is 0.9 exactly, the
    # pooled relative variance 4 / 100^2, 3 + 3 - 2 = 4 degrees of freedom, t(0.995, 4) = 4.604, standard error
    # 0.9 x sqrt(4e-4 x (1/3 + 1/3)) = 0.014697.
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


def test_two_repetitions_a_side_or_no_throughput_gives_no_rate_interval():
    assert rate_interval([100.0, 101.0], [90.0, 91.0, 92.0], 0.99) is None  # two a side are too few
    assert rate_interval([100.0, 101.0, 99.0], [0.0, 0.0, 0.0], 0.99) is None
    steady = rate_interval([100.0, 100.0, 100.0], [90.0, 90.0, 90.0], 0.99)
    assert (steady.low, steady.high, steady.standard_error) == pytest.approx((-0.1, -0.1, 0.0))


def test_repetitions_that_move_as_a_whole_widen_a_percentiles_interval_past_the_requests(tmp_path):
    # Quiet requests (noise 0.1) whose repetitions each move as a whole, as runs on a busy machine do: the request
    # bootstrap alone would resolve the 10% shift; the repetitions' spread says the runs cannot, and the row says so.
    from kvbench.measure.run_folder import read_run_folder
    from kvbench.verdicts.compare import CompareOptions, compare

    from .test_compare import RUN_ID, entry, make_records, row, write_run

    def folder(name, factors, seed):
        reps = [make_records(seed + r, RUN_ID.format(r), ttft_factor=f, noise=0.1) for r, f in enumerate(factors)]
        return read_run_folder(write_run(tmp_path / name, [(entry(recs, r), recs) for r, recs in enumerate(reps)]))

    options = CompareOptions(metrics=("ttft_p50",))
    steady = row(compare(folder("a", [1, 1, 1], 10), folder("b", [1.1, 1.1, 1.1], 20), options), "ttft_p50")
    assert steady.verdict is Verdict.REGRESSION  # repetitions that agree still resolve it
    moving = row(compare(folder("c", [0.8, 1, 1.2], 10), folder("d", [0.9, 1.1, 1.3], 20), options), "ttft_p50")
    assert moving.note == "widened to the repetitions' spread" and moving.verdict is Verdict.INCONCLUSIVE
    assert moving.ci_low < 0 < moving.ci_high and moving.mde > 0.2
