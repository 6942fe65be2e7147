"""lm-eval end to end against our engine's HTTP server (tiny random model): its multiple-choice answers must be
the ones our model's own loglikelihoods give, and its cloze scores the ones our model's own greedy text gives."""

import json
import re
import shutil

import pytest
import torch

from kvbench.engines.kvengine.adapter import KVEngineAdapter
from kvbench.engines.kvengine.runtime.tiny import byte_tokenizer, tiny_loaded_model
from kvbench.evals.inprocess import greedy_generations, window_logits
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


def _cloze_data(folder, setting: KVSetting) -> list[float]:
    """Cloze documents whose targets are the first word our model writes greedily after the context (so each is
    answered right), except document 1, whose target is changed; returns the per-document exact match expected.
    The server stops at lm-eval's stop strings ("\\n", ".") and the first [A-Za-z']+ run is the answer."""
    loaded = tiny_loaded_model()
    tokenizer = byte_tokenizer()
    docs, expected = [], []
    for line in (DATA_DIR / "britannica_cloze.jsonl").read_text().splitlines():
        doc = json.loads(line)
        context = doc["context"][-200:]
        written = greedy_generations(loaded, "tiny-random", setting, [list(context.encode())], 6)[0]
        text = re.split(r"\n|\.|<\|endoftext\|>", tokenizer.decode(written))[0]
        word = re.search(r"[A-Za-z']+", text)
        if word is None:
            continue
        wrong = len(docs) == 1
        docs.append({"context": context, "target": word.group(0) + ("zz" if wrong else "")})
        expected.append(0.0 if wrong else 1.0)
        if len(docs) == LIMIT:
            break
    for name in ("kvb_plays_mc.yaml", "plays_mc.jsonl", "kvb_britannica_cloze.yaml"):
        shutil.copy(DATA_DIR / name, folder / name)
    (folder / "britannica_cloze.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return expected


@pytest.mark.slow
def test_lm_eval_through_local_completions_scores_what_the_model_computes(tmp_path):
    tokenizer = tmp_path / "tokenizer"
    byte_tokenizer().save_pretrained(tokenizer)
    data = tmp_path / "data"
    data.mkdir()
    expected_cloze = _cloze_data(data, KVSetting("fp8_e4m3", "channel"))
    assert len(expected_cloze) == LIMIT
    adapter = KVEngineAdapter({"model": "tiny-random", "kv_dtype": "fp8_e4m3", "kv_scale": "channel"}, tmp_path)
    adapter.start()
    try:
        adapter.wait_healthy(120)
        scores = run_lm_eval(
            adapter.base_url,
            ["kvb_plays_mc", "kvb_britannica_cloze"],
            LMEvalOptions(tokenizer=tokenizer, limit=LIMIT, max_length=512, data_dir=data),
            tmp_path,
        )
    finally:
        adapter.stop()
    by_name = {(s.task, s.metric): s for s in scores}
    accuracy = by_name[("kvb_plays_mc", "acc")]
    assert accuracy.samples == LIMIT and accuracy.stderr is not None
    assert accuracy.value == _expected_accuracy(KVSetting("fp8_e4m3", "channel"))
    assert len(accuracy.per_doc) == LIMIT and sum(accuracy.per_doc) / LIMIT == accuracy.value
    cloze = by_name[("kvb_britannica_cloze", "exact_match")]  # the generation path, document by document
    assert cloze.samples == LIMIT and list(cloze.per_doc) == expected_cloze
