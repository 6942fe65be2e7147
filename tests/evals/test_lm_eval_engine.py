"""lm-eval end to end against our engine's HTTP server (tiny random model): its multiple-choice answers must be
the ones our model's own loglikelihoods give."""

import json

import pytest
import torch

from kvbench.engines.kvengine.adapter import KVEngineAdapter
from kvbench.engines.kvengine.runtime.tiny import byte_tokenizer, tiny_loaded_model
from kvbench.evals.inprocess import window_logits
from kvbench.evals.kv_settings import KVSetting
from kvbench.evals.lm_eval_run import LMEvalOptions, run_lm_eval
from kvbench.evals.tasks import DATA_DIR

LIMIT = 4


def _expected_accuracy(setting: KVSetting) -> float:
    """The byte tokenizer maps text to its bytes, so lm-eval's context/continuation split is the byte split."""
    loaded = tiny_loaded_model()
    docs = [json.loads(line) for line in (DATA_DIR / "plays_mc.jsonl").read_text().splitlines()[:LIMIT]]
    correct = 0
    for doc in docs:
        context = list((doc["context"] + "\n").encode())
        scores = []
        for choice in doc["choices"]:
            continuation = list((" " + choice).encode())
            ids = context + continuation
            logprobs = torch.log_softmax(window_logits(loaded, setting, ids).double(), -1)
            scores.append(sum(float(logprobs[p - 1, ids[p]]) for p in range(len(context), len(ids))))
        correct += max(range(4), key=scores.__getitem__) == doc["label"]
    return correct / len(docs)


@pytest.mark.slow
def test_lm_eval_through_local_completions_scores_what_the_model_computes(tmp_path):
    tokenizer = tmp_path / "tokenizer"
    byte_tokenizer().save_pretrained(tokenizer)
    adapter = KVEngineAdapter({"model": "tiny-random", "kv_dtype": "fp8_e4m3", "kv_scale": "channel"}, tmp_path)
    adapter.start()
    try:
        adapter.wait_healthy(120)
        scores = run_lm_eval(adapter.base_url, ["kvb_plays_mc", "kvb_britannica_cloze"],
                             LMEvalOptions(tokenizer=tokenizer, limit=LIMIT, max_length=512), tmp_path)
    finally:
        adapter.stop()
    by_name = {(s.task, s.metric): s for s in scores}
    accuracy = by_name[("kvb_plays_mc", "acc")]
    assert accuracy.samples == LIMIT and accuracy.stderr is not None
    assert accuracy.value == _expected_accuracy(KVSetting("fp8_e4m3", "channel"))
    cloze = by_name[("kvb_britannica_cloze", "exact_match")]  # the generation path answered every document
    assert cloze.samples == LIMIT and 0.0 <= cloze.value <= 1.0
