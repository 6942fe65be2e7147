"""A step that fails for one request fails that request alone; an error that is the engine's own stops the
engine loop, fails every stream and tells its owner (who exits)."""

from __future__ import annotations

import asyncio
import threading

import pytest

import kvbench.engines.kvengine.runtime.engine as engine_module
from kvbench.engines.kvengine.model.sampling import SamplingParams
from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model

from .tiers_fixtures import greedy, make_engine, run, tokens

POISON_SEED = 4242


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded_model(seed=3)


@pytest.fixture
def poisoned_sampling(monkeypatch):
    """Sampling raises for any batch holding the request seeded POISON_SEED; counts the batches it saw."""
    real_sample = engine_module.sample
    calls = []

    def sample(logits, params, generators):
        calls.append(len(params))
        if any(p.seed == POISON_SEED for p in params):
            raise RuntimeError("injected: this request's sampling fails")
        return real_sample(logits, params, generators)

    monkeypatch.setattr(engine_module, "sample", sample)
    return calls


def poisoned(request_id: str, prompt) -> GenerationRequest:
    return GenerationRequest(
        request_id, tuple(prompt), 8, SamplingParams(temperature=1.0, seed=POISON_SEED), ignore_eos=True
    )


PROMPTS = {f"r{i}": list(range(100 + 7 * i, 150 + 9 * i)) for i in range(3)}


def test_a_batch_with_one_failing_request_fails_it_alone_and_the_others_finish_unchanged(loaded, poisoned_sampling):
    alone = {rid: tokens(run(make_engine(loaded), greedy(rid, p))[rid]) for rid, p in PROMPTS.items()}
    engine = make_engine(loaded, kv_capacity=1024)
    outputs = run(engine, *(greedy(rid, p) for rid, p in PROMPTS.items()), poisoned("bad", range(200, 290)))
    assert max(poisoned_sampling) == 4  # all four were in one batch, which failed, then ran one by one
    [failure] = outputs["bad"]
    assert failure.finish_reason == "error" and "injected" in failure.error
    for rid in PROMPTS:
        assert tokens(outputs[rid]) == alone[rid]
        assert outputs[rid][-1].finish_reason == "length"
    # `run` checked the pool and the index; the failed request holds nothing, and cached nothing of its own
    assert engine.pool.num_free == engine.pool.capacity - engine.index.cached_pages
    assert engine.scheduler.num_running == engine.scheduler.num_waiting == 0
    assert tokens(run(engine, greedy("after", PROMPTS["r0"]))["after"]) == alone["r0"]
    engine.close()


def test_a_failing_request_alone_in_its_step_fails_and_the_engine_serves_the_next(loaded, poisoned_sampling):
    engine = make_engine(loaded, kv_capacity=1024)
    [failure] = run(engine, poisoned("bad", range(200, 290)))["bad"]
    assert failure.error is not None and failure.finish_reason == "error"
    assert engine.pool.num_free == engine.pool.capacity - engine.index.cached_pages
    assert len(tokens(run(engine, greedy("next", PROMPTS["r1"]))["next"])) == 8
    engine.close()


def collect(async_engine: AsyncEngine, request: GenerationRequest) -> list:
    async def go():
        return [output async for output in async_engine.generate(request)]

    return asyncio.run(go())


def test_an_error_that_is_the_engines_own_fails_every_stream_and_calls_on_fatal(loaded, monkeypatch):
    engine = make_engine(loaded)
    fatal = []
    died = threading.Event()
    async_engine = AsyncEngine(engine, on_fatal=lambda exc: (fatal.append(exc), died.set()))
    real_schedule = type(engine.scheduler).schedule

    def schedule(self, now):
        if self.has_work():
            raise AssertionError("injected: the scheduler is broken")
        return real_schedule(self, now)

    monkeypatch.setattr(type(engine.scheduler), "schedule", schedule)
    async_engine.start()
    with pytest.raises(RuntimeError, match="engine failure: AssertionError: injected"):
        collect(async_engine, greedy("a", PROMPTS["r0"]))
    assert died.wait(30)
    assert isinstance(fatal[0], AssertionError)
    with pytest.raises(RuntimeError, match="the engine stopped"):
        collect(async_engine, greedy("b", PROMPTS["r1"]))
    async_engine.shutdown()
