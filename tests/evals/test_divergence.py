"""Divergence measures on hand-made logits and token lists, checked against direct formulas."""

import math

import pytest
import torch

from kvbench.evals.divergence import EMPTY, compare_generations, compare_logits, topk_kl


def test_identical_logits_give_zero_kl_and_full_agreement():
    logits = torch.randn(7, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    stats = compare_logits(logits, logits.clone(), targets)
    assert stats.kl == 0.0
    assert stats.top1_agreement == 1.0
    assert stats.perplexity_delta == 0.0


def test_kl_top1_and_perplexity_match_the_formulas():
    base = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 0.0]])
    new = torch.tensor([[0.0, 1.0, 2.0], [0.0, 3.0, 0.5]])
    targets = torch.tensor([0, 1])
    stats = compare_logits(base, new, targets)
    p, q = base.double().softmax(-1), new.double().softmax(-1)
    expected_kl = float((p * (p.log() - q.log())).sum(-1).mean())
    assert stats.kl == pytest.approx(expected_kl, rel=1e-12)
    assert stats.top1_agreement == 0.5  # row 0 argmax 0 vs 2, row 1 both 1
    nll = -(math.log(q[0, 0]) + math.log(q[1, 1])) / 2
    assert stats.perplexity == pytest.approx(math.exp(nll))


def test_stats_add_up_over_windows():
    a = compare_logits(torch.eye(3), torch.eye(3).flip(0), torch.tensor([0, 1, 2]))
    b = compare_logits(torch.eye(3), torch.eye(3), torch.tensor([0, 1, 2]))
    total = EMPTY + a + b
    assert total.positions == 6
    assert total.kl == pytest.approx(a.kl_sum / 6)
    assert total.top1_matches == a.top1_matches + 3


def test_misaligned_logits_are_rejected():
    with pytest.raises(ValueError, match="must align"):
        compare_logits(torch.zeros(2, 3), torch.zeros(3, 3), torch.tensor([0, 1]))


def test_topk_kl_is_exact_when_k_covers_the_vocabulary():
    base = torch.tensor([1.0, 0.5, -1.0, 0.0], dtype=torch.float64).log_softmax(-1)
    new = torch.tensor([0.2, 0.9, -0.5, 0.1], dtype=torch.float64).log_softmax(-1)
    exact = float((base.exp() * (base - new)).sum())
    approx = topk_kl(dict(enumerate(base.tolist())), dict(enumerate(new.tolist())), vocab_size=4)
    assert approx == pytest.approx(exact, abs=1e-9)
    # with top-2 only it is an approximation, but still >= 0 and 0 for identical maps
    top2 = dict(list(enumerate(base.tolist()))[:2])
    assert topk_kl(top2, top2, vocab_size=4) == pytest.approx(0.0, abs=1e-12)


def test_generation_comparison_reports_first_divergence_and_missing_when_identical():
    stats = compare_generations([[1, 2, 3, 4], [5, 6, 7, 8], [1, 1, 1, 1]], [[1, 2, 9, 4], [5, 6, 7, 8], [2, 1, 1, 1]])
    assert stats.exact_matches == 1
    assert stats.exact_match_rate == pytest.approx(1 / 3)
    assert stats.first_divergence == (2, None, 0)
    assert stats.mean_first_divergence == 1.0
    assert stats.matching_prefix_rate == pytest.approx((2 + 4 + 0) / 12)
    same = compare_generations([[1, 2]], [[1, 2]])
    assert same.mean_first_divergence is None and same.exact_match_rate == 1.0
