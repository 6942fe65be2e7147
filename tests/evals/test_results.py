"""Deltas, the aggregate and eval.json from hand-made results."""

from pathlib import Path

import pytest

from kvbench.evals.divergence import DivergenceStats
from kvbench.evals.lm_eval_run import TaskScore, scores_from_results
from kvbench.evals.results import SettingResult, aggregate_delta_pct, eval_json, metric_rows, signed_change_pct


def _result(label, acc, exact, ppl, kl_sum=0.0):
    scores = (
        TaskScore("kvb_plays_mc", "acc_norm", acc, 0.03, 200),
        TaskScore("kvb_britannica_cloze", "exact_match", exact, 0.02, 200),
        TaskScore("kvb_britannica_ppl", "word_perplexity", ppl, None, 42),
    )
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
    results = {
        "results": {
            "t": {
                "alias": "t",
                "acc,none": 0.5,
                "acc_stderr,none": 0.1,
                "word_perplexity,none": 9.0,
                "word_perplexity_stderr,none": "N/A",
                "sample_len,none": 4,
            }
        },
        "n-samples": {"t": {"original": 10, "effective": 4}},
    }
    scores = {s.metric: s for s in scores_from_results(results)}
    assert set(scores) == {"acc", "word_perplexity"}
    assert scores["acc"].stderr == 0.1 and scores["word_perplexity"].stderr is None
    assert scores["acc"].samples == 4
    assert scores["acc"].per_doc == () and scores["word_perplexity"].per_doc == ()  # no samples logged


def test_logged_samples_give_each_documents_value_in_doc_id_order():
    results = {
        "results": {"t": {"acc,none": 0.5, "exact_match,first_word": 0.5}},
        "samples": {
            "t": [
                {"doc_id": 1, "filter": "none", "acc": 0.0},
                {"doc_id": 0, "filter": "none", "acc": 1.0},
                {"doc_id": 0, "filter": "first_word", "exact_match": 0.0},
                {"doc_id": 1, "filter": "first_word", "exact_match": 1.0},
            ]
        },
    }
    scores = {s.metric: s for s in scores_from_results(results)}
    assert scores["acc"].per_doc == (1.0, 0.0)
    assert scores["exact_match"].per_doc == (0.0, 1.0)


def test_task_deltas_are_paired_by_document_with_mcnemar():
    # 20 documents: the baseline gets 10 right; the setting loses 4 of them and gains 1 -> 7 right
    base = [1.0] * 10 + [0.0] * 10
    new = [0.0] * 4 + [1.0] * 6 + [1.0] + [0.0] * 9

    def make(label, docs):
        return SettingResult(label, (TaskScore("kvb_plays_mc", "acc_norm", sum(docs) / 20, 0.1, 20, tuple(docs)),))

    rows = {r.setting: r for r in metric_rows([make("fp32", base), make("fp8_e5m2/tensor", new)], "fp32")}
    row = rows["fp8_e5m2/tensor"]
    assert row.delta_pct == pytest.approx(-30.0)  # (7 - 10) / 10
    assert row.ci_of == "delta_pct" and row.ci_low < -30.0 < row.ci_high and row.items == 20
    assert row.p_value == pytest.approx(2 * (1 + 5) / 2**5)  # McNemar: 4 lost, 1 gained -> 2 P(X <= 1 | 5)
    assert row.verdict.startswith("cannot resolve")  # 20 documents cannot tell 0.5% apart
    assert rows["fp32"].verdict is None and rows["fp32"].p_value == 1.0


def test_tradeoff_puts_a_run_folders_performance_beside_the_evals_deltas(tmp_path):
    import pandas as pd

    from kvbench.evals.items import DirectMetric
    from kvbench.evals.paired import PairedDelta
    from kvbench.evals.report import write_tradeoff
    from kvbench.evals.tradeoff import perf_by_setting, tradeoff_frame

    run = Path(__file__).parents[2] / "results" / "baselines" / "nightly-cpu"  # a real `kvbench run` folder, fp32 KV
    perf = perf_by_setting(run, "kvengine")  # its vLLM points are left out
    table = pd.read_csv(run / "summary.csv")
    overall = table[(table["tenant"] == "all") & (table["kv_dtype"] == "fp32")]
    assert set(perf) == {"fp32", "fp8_e4m3/tensor"} and perf["fp32"]["points"] == len(overall) == 3
    assert perf["fp32"]["output_tok_s"] == pytest.approx(overall["output_tok_s"].mean())
    assert perf["fp32"]["prefill_recompute_rate"] == pytest.approx(overall["prefill_recompute_rate"].mean())
    ppl = DirectMetric("perplexity", 21.5, 21.3, PairedDelta(-0.9, -1.2, -0.6, 120), "delta_pct")
    results = [
        SettingResult(
            "fp32", direct=(DirectMetric("perplexity", 21.3, 21.3, PairedDelta(0.0, 0.0, 0.0, 120), "delta_pct"),)
        ),
        SettingResult("fp8_e4m3/tensor", direct=(ppl,)),
        SettingResult("fp8_e5m2/tensor", direct=(ppl,)),
    ]
    frame = tradeoff_frame(perf, metric_rows(results, "fp32"), ["fp32", "fp8_e4m3/tensor"])
    fp8 = frame.set_index("kv_setting").loc["fp8_e4m3/tensor"]
    assert fp8["perplexity_delta_pct"] == -0.9 and (fp8["perplexity_ci_low"], fp8["perplexity_ci_high"]) == (-1.2, -0.6)
    assert fp8["run_points"] == 3 and fp8["output_tok_s"] > 0
    other = tradeoff_frame(perf, metric_rows(results, "fp32"), ["fp32", "fp8_e5m2/tensor"]).set_index("kv_setting")
    assert pd.isna(other.loc["fp8_e5m2/tensor", "output_tok_s"])  # not in the run: missing, not 0
    section = write_tradeoff(frame, tmp_path, run)
    assert "-0.90% [-1.20, -0.60]" in section and (tmp_path / "eval_tradeoff.png").exists()


def test_items_for_the_claim_scale_with_the_square_of_the_half_width():
    from kvbench.evals.result_frames import items_for_claim
    from kvbench.evals.results import MetricRow

    row = MetricRow("fp8", "direct", "perplexity", 21.5, None, 21.3, 0.2, -0.9, -1.9, 0.1, "delta_pct", None, 100)
    assert items_for_claim(row) == 400  # half-width 1.0% -> (1.0 / 0.5)^2 x 100 items
    assert items_for_claim(MetricRow("fp8", "direct", "kl", 0.1, None, 0.0, 0.1, None)) is None


def test_a_task_without_a_flip_is_not_read_as_no_loss():
    """40 documents scored the same under both settings: the row's interval is the flips' (Bonett-Price), not the
    bootstrap's [0, 0], and the verdict says the run cannot resolve 0.5%."""
    docs = tuple([1.0] * 17 + [0.0] * 23)
    base = SettingResult("fp32", (TaskScore("kvb_plays_mc", "acc", 17 / 40, 0.08, 40, docs),))
    same = SettingResult("fp8_e4m3/tensor", (TaskScore("kvb_plays_mc", "acc", 17 / 40, 0.08, 40, docs),))
    (row,) = [r for r in metric_rows([base, same], "fp32") if r.setting == "fp8_e4m3/tensor"]
    assert row.delta_pct == 0.0 and row.ci_low == pytest.approx(-row.ci_high) and row.ci_high > 10
    assert row.verdict.startswith("cannot resolve")
