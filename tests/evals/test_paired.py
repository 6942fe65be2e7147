"""Paired intervals, McNemar and the verdict against cases computed by hand."""

import math

import numpy as np
import pytest

from kvbench.evals.divergence import PositionScores
from kvbench.evals.items import buckets, direct_metrics, make_items
from kvbench.evals.paired import (
    PairedDelta,
    mcnemar_exact,
    paired_binary_difference,
    paired_mean_difference,
    paired_ratio,
    proportion_ci,
    verdict,
)


def test_mcnemar_exact_is_the_two_sided_binomial_of_the_flips():
    # 3 lost, 0 gained: P = 2 * (1/2)^3
    result = mcnemar_exact([1, 1, 1, 0, 1, 1], [0, 0, 1, 0, 1, 0])
    assert (result.lost, result.gained) == (3, 0) and result.p_value == pytest.approx(0.25)
    # 6 lost, 1 gained: P = 2 * (C(7,0) + C(7,1)) / 2^7 = 16/128
    base, new = [1] * 6 + [0] + [1] * 5, [0] * 6 + [1] + [1] * 5
    assert mcnemar_exact(base, new).p_value == pytest.approx(0.125)
    # no flip at all: nothing against "no difference"
    assert mcnemar_exact([1, 0, 1], [1, 0, 1]).p_value == 1.0


def test_paired_ratio_point_and_interval_of_two_items():
    # items (1/1) and (3/1): a resample holds (2,0), (1,1) or (0,2) of them -> 1, 2, 3 with P 1/4, 1/2, 1/4,
    # so the 95% percentile interval is exactly [1, 3]; the point is the ratio of sums 4/2.
    result = paired_ratio(np.array([1.0, 3.0]), np.array([1.0, 1.0]))
    assert result.delta == 2.0 and (result.ci_low, result.ci_high) == (1.0, 3.0) and result.items == 2
    # ratio of sums, not mean of ratios: (1 + 2 + 3) / (1 + 1 + 2)
    assert paired_ratio(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 2.0])).delta == 1.5


def test_pairing_removes_the_spread_between_items():
    # items differ a lot from each other, but the setting adds exactly 0.01 to every one of them
    base = np.array([0.1, 5.0, 2.0, 9.0, 0.5, 3.0])
    result = paired_mean_difference(base + 0.01, base)
    assert result.delta == pytest.approx(0.01)
    assert result.ci_low == pytest.approx(0.01) and result.ci_high == pytest.approx(0.01)
    assert result.significant
    # and a single item has no interval
    assert paired_mean_difference(np.array([1.0]), np.array([0.0])).ci_low is None


def test_paired_binary_difference_is_bonett_price_by_hand():
    # 50 documents: 5 right -> wrong, 1 wrong -> right, 44 unchanged
    base = np.array([1] * 5 + [0] * 1 + [1] * 30 + [0] * 14, dtype=bool)
    new = np.array([0] * 5 + [1] * 1 + [1] * 30 + [0] * 14, dtype=bool)
    got = paired_binary_difference(base, new)
    p_lost, p_gained = 6 / 52, 2 / 52
    centre = p_gained - p_lost
    half = 1.959964 * ((p_lost + p_gained - centre**2) / 52) ** 0.5
    assert got.delta == pytest.approx(-4 / 50)
    assert (got.ci_low, got.ci_high) == pytest.approx((centre - half, centre + half), abs=1e-6)
    assert got.items == 50


def test_no_flip_among_40_documents_cannot_resolve_half_a_percent():
    """The bootstrap of paired 0/1 items collapses to [0, 0] without a flip (it read "loss < 0.5%" for 40
    documents); the flips' interval keeps ~6.6 points of accuracy either way."""
    base = np.array([1] * 17 + [0] * 23, dtype=bool)
    same = paired_binary_difference(base, base)
    assert same.delta == 0.0 and same.ci_high == pytest.approx(1.959964 * (2 / 42 / 42) ** 0.5, abs=1e-6)
    assert same.ci_low == -same.ci_high
    as_pct = PairedDelta(0.0, 100 * same.ci_low / base.mean(), 100 * same.ci_high / base.mean(), 40)
    assert verdict(as_pct).startswith("cannot resolve")


def test_clopper_pearson_interval():
    low, high = proportion_ci(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10))  # (alpha/2)^(1/n) = P(0 of n) at the bound
    low, high = proportion_ci(10, 10)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 10))
    assert proportion_ci(0, 0) is None


def test_verdict_names_what_the_interval_can_resolve():
    assert verdict(PairedDelta(-0.2, -0.4, 0.0, 100)) == "loss < 0.5%"
    assert verdict(PairedDelta(-1.0, -1.3, -0.7, 100)) == "loss > 0.5%"
    assert verdict(PairedDelta(-0.5, -0.8, -0.2, 100)) == "undecided at 0.5% (CI spans it)"
    assert verdict(PairedDelta(-3.0, -4.5, -1.5, 100)) == "loss > 0.5%"  # wide, but wholly beyond the claim
    assert verdict(PairedDelta(0.1, -0.45, 0.9, 100)) == "loss < 0.5%"  # wide, but wholly inside it
    assert verdict(PairedDelta(-0.2, -1.2, 0.8, 100)).startswith("cannot resolve (CI half-width 1.00% > 0.5%)")
    assert verdict(PairedDelta(0.0, None, None, 1)).startswith("cannot resolve")


def _window(n, nll_shift, match=None, correct=None, base_correct=None):
    ones = np.ones(n, dtype=bool)
    base_nll = np.linspace(1.0, 3.0, n)
    return PositionScores(
        np.arange(n),
        np.full(n, 0.01),
        base_nll + nll_shift,
        base_nll,
        ones if match is None else np.asarray(match, bool),
        ones if correct is None else np.asarray(correct, bool),
        ones if base_correct is None else np.asarray(base_correct, bool),
    )


def test_items_are_blocks_and_buckets_keep_their_positions():
    items = make_items([_window(5, 0.0), _window(3, 0.0)], block=2)
    assert items.positions.tolist() == [2, 2, 1, 2, 1]
    late = make_items([_window(5, 0.0), _window(3, 0.0)], block=2, low=2, high=4)
    assert late.positions.tolist() == [2, 1]  # positions 2, 3 of the first window, 2 of the second
    assert buckets(300) == [(0, 128), (128, 256), (256, 299)]


def test_direct_metrics_by_hand():
    # every position's NLL is 0.01 higher: perplexity x e^0.01, signed delta -100 (1 - e^-0.01)% exactly
    correct = [True, False, True, True] * 25
    base_correct = [True, True, True, False] * 25  # 25 lost, 25 gained
    metrics = {
        m.name: m
        for m in direct_metrics(
            make_items(
                [_window(100, 0.01, match=[True, False] * 50, correct=correct, base_correct=base_correct)], block=10
            )
        )
    }
    ppl = metrics["perplexity"]
    assert ppl.value / ppl.baseline == pytest.approx(math.exp(0.01))
    assert ppl.delta.delta == pytest.approx(100 * math.expm1(-0.01))
    assert ppl.delta.ci_low == pytest.approx(ppl.delta.delta) and ppl.delta.ci_high == pytest.approx(ppl.delta.delta)
    top1 = metrics["top1_agreement"]
    assert top1.value == 0.5 and top1.delta.delta == pytest.approx(-50.0)
    acc = metrics["next_token_acc"]
    assert acc.value == acc.baseline == 0.75 and acc.delta.delta == 0.0
    assert (acc.mcnemar.lost, acc.mcnemar.gained) == (25, 25) and acc.mcnemar.p_value == 1.0
    assert metrics["kl"].value == pytest.approx(0.01) and metrics["kl"].interval_of == "value"
