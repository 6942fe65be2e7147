"""Passkey prompts and their scoring: exact against greedy decoding (tiny model), retrieved by SmolLM2 at the
baseline at 512 and 1,024 tokens."""

import dataclasses

import pytest

from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.evals.inprocess import greedy_generations, window_logits
from kvbench.evals.kv_settings import KVSetting
from kvbench.evals.passkey import PasskeyPrompt, passkey_prompts, retrieved
from kvbench.evals.tasks import corpus_text

FP32 = KVSetting("fp32")


def test_prompts_have_the_length_the_needle_at_its_depth_and_the_key_as_answer():
    encode = lambda text: list(text.encode())  # noqa: E731  (bytes: one token per character)
    haystack = list(range(1000, 3000))
    prompts = passkey_prompts(encode, haystack, [400, 600], depths=(0.0, 0.5, 1.0))
    assert [(p.length, p.depth) for p in prompts] == [
        (400, 0.0),
        (400, 0.5),
        (400, 1.0),
        (600, 0.0),
        (600, 0.5),
        (600, 1.0),
    ]
    for p in prompts:
        assert len(p.ids) == p.length
        assert bytes(p.ids[p.answer_start :]).decode() == p.key and len(p.key) == 5
        needle = list(f" The pass key is {p.key}.".encode())
        at = next(i for i in range(len(p.ids)) if list(p.ids[i : i + len(needle)]) == needle)
        filler = [t for t in p.ids if t >= 1000]
        before = sum(1 for t in p.ids[:at] if t >= 1000)
        assert before == round(p.depth * len(filler))  # the needle sits at its depth in the haystack
    assert len({p.key for p in prompts}) == len(prompts)


def test_retrieved_is_exactly_greedy_decoding_writing_the_answer():
    tiny = tiny_loaded_model(seed=0)
    context = list(range(60, 160))
    written = greedy_generations(tiny, "tiny-random", FP32, [context], 4)[0]
    prompt = PasskeyPrompt(len(context) + 4, 0.5, "x", tuple(context + written), len(context))
    argmax = window_logits(tiny, FP32, prompt.ids).argmax(-1).tolist()
    assert retrieved(argmax, prompt)  # what greedy writes is retrieved
    for wrong_at in range(4):  # one wrong answer token anywhere and it is not
        ids = list(prompt.ids)
        ids[len(context) + wrong_at] = (ids[len(context) + wrong_at] + 1) % tiny.config.vocab_size
        changed = dataclasses.replace(prompt, ids=tuple(ids))
        assert not retrieved(window_logits(tiny, FP32, changed.ids).argmax(-1).tolist(), changed)


@pytest.mark.slow
def test_smollm2_baseline_retrieves_the_passkey_at_512_and_1024_tokens():
    from kvbench.engines.kvengine.model.loader import load_model

    loaded = load_model("default")
    encode = lambda text: list(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    haystack = encode(corpus_text())
    prompts = passkey_prompts(encode, haystack, [512, 1024], depths=(0.1, 0.5, 0.9))
    outcomes = [retrieved(window_logits(loaded, FP32, p.ids).argmax(-1).tolist(), p) for p in prompts]
    assert outcomes == [True] * 6
