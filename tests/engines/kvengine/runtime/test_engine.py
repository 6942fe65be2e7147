"""The engine step loop on a tiny random model: prefix reuse, batching, preemption and stops."""

from __future__ import annotations

import pytest

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model.sampling import SamplingParams
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.runtime.tiny import EOS_ID, tiny_loaded_model
from kvbench.engines.kvengine.settings.config import EngineConfig

from .tiers_fixtures import greedy, run, tokens


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded_model(seed=3)


def engine(loaded, **settings) -> Engine:
    return Engine(EngineConfig(**{"kv_capacity": 2048, **settings}), loaded)


PROMPT = list(range(300, 380))  # 80 tokens = 5 full pages


def test_second_request_with_the_same_prefix_is_served_from_cache_with_identical_output(loaded):
    eng = engine(loaded)
    first = run(eng, greedy("a", PROMPT))["a"]
    second = run(eng, greedy("b", PROMPT))["b"]
    assert first[-1].cached_tokens == 0
    # 80 prompt tokens: 4 full pages reused (the last token is always computed, so page 5 is recomputed)
    assert second[-1].cached_tokens == 64
    assert tokens(second) == tokens(first)


def test_prefix_caching_off_reports_no_cached_tokens(loaded):
    eng = engine(loaded, prefix_caching=False)
    run(eng, greedy("a", PROMPT))
    assert run(eng, greedy("b", PROMPT))["b"][-1].cached_tokens == 0


def test_batched_requests_give_the_same_tokens_as_alone(loaded):
    prompts = {f"r{i}": [300 + i] + list(range(100 + 7 * i, 150 + 11 * i)) for i in range(5)}
    alone = {rid: tokens(run(engine(loaded), greedy(rid, p))[rid]) for rid, p in prompts.items()}
    together = run(engine(loaded, max_step_tokens=64), *(greedy(rid, p) for rid, p in prompts.items()))
    for rid in prompts:
        assert tokens(together[rid]) == alone[rid]
        assert together[rid][-1].finish_reason == "length"


def test_preemption_under_a_tiny_kv_tier_keeps_outputs_identical(loaded):
    prompts = {f"r{i}": list(range(200 + 13 * i, 260 + 13 * i)) for i in range(4)}
    roomy = run(engine(loaded), *(greedy(rid, p, 24) for rid, p in prompts.items()))
    # 12 pages of 16 tokens cannot hold four 84-token sequences at once: someone must be preempted
    tight_engine = engine(loaded, kv_capacity=192, max_step_tokens=128)
    tight = run(tight_engine, *(greedy(rid, p, 24) for rid, p in prompts.items()))
    for rid in prompts:
        assert tokens(tight[rid]) == tokens(roomy[rid])


def test_eos_stops_unless_ignored_and_max_tokens_is_kept(loaded):
    eng = engine(loaded)
    # Force EOS: a request whose only allowed stop is the first greedy token.
    probe = tokens(run(eng, greedy("p", PROMPT, 1))["p"])[0]
    stopped = run(eng, GenerationRequest("s", tuple(PROMPT), 8, stop_token_ids=frozenset({probe})))["s"]
    assert tokens(stopped) == [probe] and stopped[-1].finish_reason == "stop"
    ignored = run(eng, greedy("i", PROMPT, 8, stop_token_ids=frozenset({probe})))["i"]
    assert len(tokens(ignored)) == 8 and ignored[-1].finish_reason == "length"
    assert EOS_ID in eng.loaded.eos_token_ids


def test_abort_releases_pages_and_caches_what_was_computed(loaded):
    eng = engine(loaded, max_step_tokens=32)
    eng.add(greedy("a", PROMPT, 50))
    eng.step()
    eng.step()  # 64 of 80 prompt tokens computed
    out = eng.abort("a", "abort")
    assert out.finish_reason == "abort"
    assert not eng.has_work()
    eng.pool.check_integrity()
    assert run(eng, greedy("b", PROMPT))["b"][-1].cached_tokens == 64


def test_seeded_sampling_is_reproducible_and_temperature_matters(loaded):
    def sampled(seed):
        request = GenerationRequest("x", tuple(PROMPT), 12, SamplingParams(temperature=1.5, seed=seed), ignore_eos=True)
        return tokens(run(engine(loaded), request)["x"])

    assert sampled(7) == sampled(7)
    assert sampled(7) != sampled(8)


def test_prompt_logprobs_cover_every_prompt_token_even_with_chunking_and_cache(loaded):
    eng = engine(loaded, max_step_tokens=24)
    run(eng, greedy("warm", PROMPT))  # the prefix is cached, but prompt logprobs must not use it
    out = run(eng, GenerationRequest("lp", tuple(PROMPT), 1, ignore_eos=True, logprobs=2, prompt_logprobs=2))["lp"]
    entries = out[0].prompt_logprobs
    assert [entry.token_id for entry in entries] == PROMPT[1:]
    assert out[-1].cached_tokens == 0
    assert all(entry.logprob <= 0 and len(entry.top) == 2 for entry in entries)
    # the same numbers without chunking
    whole = run(engine(loaded), GenerationRequest("lp2", tuple(PROMPT), 1, ignore_eos=True, prompt_logprobs=2))["lp2"]
    assert [e.logprob for e in whole[0].prompt_logprobs] == pytest.approx([e.logprob for e in entries], abs=1e-4)


@pytest.mark.parametrize("kv_dtype, ratio", [("bf16", 2), ("fp8_e4m3", 4), ("fp8_e5m2", 4)])
def test_capacity_in_bytes_follows_the_kv_dtype(loaded, kv_dtype, ratio):
    budget = 512 * 1024
    fp32 = engine(loaded, kv_capacity_bytes=budget)
    other = engine(loaded, kv_capacity_bytes=budget, kv_dtype=kv_dtype)
    assert fp32.bytes_per_token == ratio * other.bytes_per_token
    assert other.pool.capacity == pytest.approx(ratio * fp32.pool.capacity, abs=1)


def test_requests_the_engine_cannot_serve_are_refused_with_the_reason(loaded):
    eng = engine(loaded)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        eng.limits.check(greedy("long", [300] * 9000))
    with pytest.raises(ValueError, match="max_tokens"):
        eng.limits.check(GenerationRequest("n", (1, 2), 0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.limits.check(greedy("v", [1, 99999]))
    # The server checks at its boundary; of those checks the engine keeps only the one that protects the device.
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add(greedy("v", [1, 99999]))
    assert not eng.has_work()
    with pytest.raises(ValueError, match="kv_dtype"):
        EngineConfig(kv_dtype="fp4")


def test_the_kv_format_is_parsed_once_and_the_model_receives_the_value(loaded, monkeypatch):
    parsed = []
    parse = KVFormat.parse.__func__
    monkeypatch.setattr(KVFormat, "parse", classmethod(lambda cls, *names: parsed.append(names) or parse(cls, *names)))
    # (a number of prefill tokens: `auto` copies the config once resolved, which parses it again)
    config = EngineConfig(kv_dtype="fp8_e4m3", kv_scale="channel", kv_capacity=1024, max_prefill_beside_decodes=64)
    eng = Engine(config, loaded)
    assert parsed == [("fp8_e4m3", "channel")]  # by the config, from the settings' names
    assert eng.kv_cache.fmt is config.kv_format and eng.kv_cache.k_shift is not None
