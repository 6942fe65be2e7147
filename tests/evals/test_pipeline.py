"""The eval pipeline on the tiny random model: exact self-agreement of the baseline, FP8 drift, the run folder."""

import json

import pytest
import torch

from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.evals.inprocess import corpus_prompts, divergence_pass, greedy_generations, window_logits, windows
from kvbench.evals.kv_settings import KVSetting, kv_settings
from kvbench.evals.runner import EvalConfig, run_eval
from kvbench.measure.run_folder import EVAL_JSON, read_eval_metrics
from kvbench.settings import SettingsError

FP32 = KVSetting("fp32")


@pytest.fixture(scope="module")
def tiny():
    return tiny_loaded_model(seed=0)


def test_unquantized_against_itself_gives_kl_zero_and_full_top1_agreement(tiny):
    ids = list(range(40, 240))
    assert torch.equal(window_logits(tiny, FP32, ids), window_logits(tiny, FP32, ids))  # a recompute is identical
    stats = divergence_pass(tiny, FP32, [FP32, KVSetting("fp8_e5m2", "tensor")], windows(ids, 96, None))
    assert stats["fp32"].positions == 199 - 2  # windows 96 + 96 + 8 tokens score 95 + 95 + 7 positions
    assert stats["fp32"].kl_sum == 0.0
    assert stats["fp32"].top1_agreement == 1.0
    assert stats["fp8_e5m2/tensor"].kl > 1e-4  # and the pipeline does see quantization
    assert stats["fp8_e5m2/tensor"].top1_agreement < 1.0


def test_greedy_generations_of_the_baseline_repeat_exactly(tiny):
    prompts = corpus_prompts(list(range(40, 240)), 2, 64)
    first = greedy_generations(tiny, "tiny-random", FP32, prompts, 8)
    again = greedy_generations(tiny, "tiny-random", FP32, prompts, 8)
    assert first == again and all(len(tokens) == 8 for tokens in first)


def test_run_folder_holds_tables_and_an_eval_json_that_compare_reads(tmp_path):
    config = EvalConfig(
        model="tiny-random",
        kv_dtypes=("fp32", "fp8_e4m3"),
        kv_scales=("tensor",),
        lm_eval=False,
        divergence_tokens=300,
        divergence_window=150,
        greedy_prompts=2,
        greedy_prompt_tokens=48,
        greedy_tokens=6,
    )
    paths = run_eval(config, tmp_path)
    evals = read_eval_metrics(paths[EVAL_JSON])
    assert set(evals) == {"fp32", "fp8_e4m3/tensor"}
    assert evals["fp32"]["kl"] == 0.0 and evals["fp32"]["top1_agreement"] == 1.0
    assert evals["fp8_e4m3/tensor"]["kl"] > 0.0
    assert evals["fp32"]["greedy_first_diff_pos"] is None  # nothing diverged: missing, not 0
    assert json.loads(paths["eval.json"].read_text())["baseline"] == "fp32"
    markdown = paths["eval.md"].read_text()
    assert "| fp8_e4m3/tensor |" in markdown and "n/a" in markdown
    assert paths["eval.csv"].read_text().startswith("setting,source,name,value,stderr,baseline,delta,delta_pct")


def test_bad_config_names_the_field():
    with pytest.raises(SettingsError, match="tasks: unknown hellaswagg; .*e.g. hellaswag"):  # lm-eval knows hellaswag
        EvalConfig(tasks=("hellaswagg",))
    with pytest.raises(SettingsError, match="divergence_window"):
        EvalConfig(divergence_window=0)
    assert [s.label for s in EvalConfig().settings] == [
        s.label for s in kv_settings(["fp32", "fp16", "fp8_e4m3", "fp8_e5m2"], ["tensor", "channel"])
    ]
