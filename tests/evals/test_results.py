"""Deltas, the aggregate and eval.json from hand-made results."""

import pytest

from kvbench.evals.divergence import DivergenceStats
from kvbench.evals.lm_eval_run import TaskScore, scores_from_results
from kvbench.evals.results import SettingResult, aggregate_delta_pct, eval_json, metric_rows, signed_change_pct


def _result(label, acc, exact, ppl, kl_sum=0.0):
    scores = (TaskScore("kvb_plays_mc", "acc_norm", acc, 0.03, 200), TaskScore("kvb_britannica_cloze", "exact_match", exact, 0.02, 200),
              TaskScore("kvb_britannica_ppl", "word_perplexity", ppl, None, 42))
    return SettingResult(label, scores, DivergenceStats(100, kl_sum, 95, 300.0, 299.0), "exact")


def test_signed_change_is_negative_for_a_loss_in_either_direction():
    assert signed_change_pct("task/acc", 0.49, 0.50) == pytest.approx(-2.0)
    assert signed_change_pct("task/word_perplexity", 20.0, 19.0) == pytest.approx(100 * (19 / 20 - 1))
    assert signed_change_pct("task/acc", 0.5, 0.0) is None  # undefined, not 0


def test_aggregate_is_the_mean_of_the_task_headlines():
    results = [_result("fp32", 0.50, 0.20, 19.0), _result("fp8_e4m3/tensor", 0.49, 0.20, 20.0, kl_sum=0.5)]
    rows = metric_rows(results, "fp32")
    expected = (-2.0 + 0.0 + 100 * (19 / 20 - 1)) / 3
    assert aggregate_delta_pct(rows, "fp8_e4m3/tensor") == pytest.approx(expected)
    assert aggregate_delta_pct(rows, "fp32") == 0.0
    data = eval_json(results, "fp32")
    fp8 = data["settings"][1]
    assert fp8["kv_setting"] == "fp8_e4m3/tensor"
    assert fp8["metrics"]["kl"] == pytest.approx(0.005)
    assert fp8["metrics"]["kvb_plays_mc/acc_norm"] == 0.49


def test_lm_eval_results_become_scores_with_stderr_or_none():
    results = {"results": {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1, "word_perplexity,none": 9.0,
                                  "word_perplexity_stderr,none": "N/A", "sample_len,none": 4}},
               "n-samples": {"t": {"original": 10, "effective": 4}}}
    scores = {s.metric: s for s in scores_from_results(results)}
    assert set(scores) == {"acc", "word_perplexity"}
    assert scores["acc"].stderr == 0.1 and scores["word_perplexity"].stderr is None
    assert scores["acc"].samples == 4
    assert scores["acc"].per_doc == () and scores["word_perplexity"].per_doc == ()  # no samples logged


def test_logged_samples_give_each_documents_value_in_doc_id_order():
    results = {"results": {"t": {"acc,none": 0.5, "exact_match,first_word": 0.5}},
               "samples": {"t": [{"doc_id": 1, "filter": "none", "acc": 0.0},
                                 {"doc_id": 0, "filter": "none", "acc": 1.0},
                                 {"doc_id": 0, "filter": "first_word", "exact_match": 0.0},
                                 {"doc_id": 1, "filter": "first_word", "exact_match": 1.0}]}}
    scores = {s.metric: s for s in scores_from_results(results)}
    assert scores["acc"].per_doc == (1.0, 0.0)
    assert scores["exact_match"].per_doc == (0.0, 1.0)


def test_task_deltas_are_paired_by_document_with_mcnemar():
    # 20 documents: the baseline gets 10 right; the setting loses 4 of them and gains 1 -> 7 right
    base = [1.0] * 10 + [0.0] * 10
    new = [0.0] * 4 + [1.0] * 6 + [1.0] + [0.0] * 9
    make = lambda label, docs: SettingResult(label, (TaskScore("kvb_plays_mc", "acc_norm", sum(docs) / 20, 0.1, 20,
                                                                tuple(docs)),))  # noqa: E731
    rows = {r.setting: r for r in metric_rows([make("fp32", base), make("fp8_e5m2/tensor", new)], "fp32")}
    row = rows["fp8_e5m2/tensor"]
    assert row.delta_pct == pytest.approx(-30.0)  # (7 - 10) / 10
    assert row.ci_of == "delta_pct" and row.ci_low < -30.0 < row.ci_high and row.items == 20
    assert row.p_value == pytest.approx(2 * (1 + 5) / 2 ** 5)  # McNemar: 4 lost, 1 gained -> 2 P(X <= 1 | 5)
    assert row.verdict.startswith("cannot resolve")  # 20 documents cannot tell 0.5% apart
    assert rows["fp32"].verdict is None and rows["fp32"].p_value == 1.0
