"""max_prefill_beside_decodes `auto`: the engine times a pure decode step and the same step with a prefill chunk
beside it, and takes the core's rule on the two. Here the engine's step clock is an instrument: every model run
advances it by a known cost (DECODE_S, plus PER_TOKEN_S per prefill token), so the probe must find exactly the
budget that cost allows, and leave nothing behind it (no cached pages, no counted requests)."""

from __future__ import annotations

import types

import pytest

from kvbench.engines.kvengine.runtime import engine as engine_module
from kvbench.engines.kvengine.runtime.budget_probe import build_engine
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig

DECODE_S = 0.040
PER_TOKEN_S = 0.0015  # 40 ms a decode step, 1.5 ms a prefill token: within 3x (the default), 53 tokens


@pytest.fixture
def instrument(monkeypatch):
    """The engine's perf_counter, advanced only by model runs: DECODE_S + per_token x the tokens of its prefill
    chunks. Returns the namespace; set its per_token to change the cost."""
    clock = types.SimpleNamespace(now=0.0, per_token=PER_TOKEN_S, runs=[])
    monkeypatch.setattr(
        engine_module, "time", types.SimpleNamespace(perf_counter=lambda: clock.now, monotonic=lambda: clock.now)
    )
    real_run = Engine._run

    def timed_run(self, seqs):
        prefill = sum(s.end - s.start for s in seqs if s.end - s.start > 1)
        clock.now += DECODE_S + clock.per_token * prefill
        clock.runs.append(tuple(s.end - s.start for s in seqs))
        return real_run(self, seqs)

    monkeypatch.setattr(Engine, "_run", timed_run)
    return clock


def settings(**overrides) -> EngineConfig:
    return EngineConfig(
        **{"model": "tiny-random", "kv_capacity": 2048, "max_step_tokens": 256, "threads": 1, **overrides}
    )


def metric(engine: Engine, name: str) -> float | None:
    for line in engine.metrics.exposition().decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_auto_is_the_default_and_finds_the_budget_the_step_cost_allows(instrument):
    assert EngineConfig().max_prefill_beside_decodes == AUTO
    engine = build_engine(settings())
    try:
        budget = engine.prefill_budget
        # 64 was already too many; 53 (where the line crosses) was within, and the next crossing is 53 again
        assert budget is not None and [n for n, _ in budget.step_s] == [0, 53, 64]
        assert [s for _, s in budget.step_s] == pytest.approx([DECODE_S + n * PER_TOKEN_S for n in (0, 53, 64)])
        # 40 ms + n x 1.5 ms <= 3 x 40 ms: n = 53
        assert budget.tokens == 53
        assert engine.config.max_prefill_beside_decodes == engine.scheduler.config.max_prefill_beside_decodes == 53
        assert metric(engine, "kvbench:prefill_beside_decodes_tokens") == 53
        # the probe left nothing: no page held or cached, no request counted, prefix caching back on
        assert engine.pool.num_free == engine.pool.capacity
        assert metric(engine, "kvbench:prompt_tokens_total") is None
        assert metric(engine, "kvbench:generation_tokens_total") is None
        assert engine.scheduler.config.prefix_caching
        # (both probe rounds ran: a pure decode and a decode beside a full probe chunk)
        assert (1,) in instrument.runs and (1, 64) in instrument.runs
    finally:
        engine.close()


def test_the_factor_and_the_step_budget_bound_it(instrument):
    engine = build_engine(settings(decode_stall_factor=2.0))
    assert engine.config.max_prefill_beside_decodes == 26  # 40 ms + n x 1.5 ms <= 80 ms
    engine.close()
    instrument.per_token = 0.0  # prefill beside a decode costs nothing measurable (a GPU's small model)
    engine = build_engine(settings())
    assert engine.config.max_prefill_beside_decodes == 255  # the step budget alone (less the decode's token)
    assert [n for n, _ in engine.prefill_budget.step_s] == [0, 64, 128, 255]  # walked up to it
    engine.close()


def test_a_small_device_kv_shrinks_the_probe_not_the_engine(instrument):
    engine = build_engine(settings(kv_capacity=192, page_size=16, decode_stall_factor=2.0))  # 12 pages
    try:
        # 192 tokens: chunks of at most 32 (the decode and three chunks fit); the rule is the same line
        assert [n for n, _ in engine.prefill_budget.step_s] == [0, 26, 32]
        assert engine.config.max_prefill_beside_decodes == 26
        engine.add(GenerationRequest("after", tuple(range(1, 60)), 4, ignore_eos=True))
        outputs = []
        while engine.has_work():
            outputs += engine.step()
        assert any(o.finished for o in outputs)
    finally:
        engine.close()


def test_a_number_is_taken_as_it_is(instrument):
    engine = build_engine(settings(max_prefill_beside_decodes=7))
    assert engine.prefill_budget is None and engine.scheduler.config.max_prefill_beside_decodes == 7
    assert not instrument.runs  # nothing was probed
    engine.close()


def test_a_bad_value_names_the_field():
    with pytest.raises(ValueError, match="max_prefill_beside_decodes 'fast' must be a number of tokens or 'auto'"):
        EngineConfig(max_prefill_beside_decodes="fast")
    with pytest.raises(ValueError, match="decode_stall_factor"):
        EngineConfig(decode_stall_factor=1.0)


def test_greedy_output_is_the_same_whatever_the_budget():
    """The budget only changes which step computes which prompt tokens: prompts joining beside decodes in chunks
    of 5 generate the greedy tokens they generate unchunked."""

    def generate(budget: int) -> dict[str, list[int]]:
        engine = build_engine(settings(max_prefill_beside_decodes=budget, max_num_seqs=4))
        arrivals = {0: [("a", 40, 24)], 2: [("b", 90, 10)], 4: [("c", 61, 8)]}
        tokens: dict[str, list[int]] = {rid: [] for step in arrivals.values() for rid, _, _ in step}
        t = 0
        try:
            while t <= max(arrivals) or engine.has_work():
                for rid, n, out in arrivals.get(t, []):
                    engine.add(
                        GenerationRequest(rid, tuple(range(7 * len(rid), 7 * len(rid) + n)), out, ignore_eos=True)
                    )
                for output in engine.step():
                    if output.token_id is not None:
                        tokens[output.request_id].append(output.token_id)
                t += 1
        finally:
            engine.close()
        return tokens

    chunked, whole = generate(5), generate(255)
    assert chunked == whole and all(len(v) for v in whole.values())
