"""The simulator schedules our engine's steps under its prefill budget beside decodes: the real engine (tiny
random weights, driven step by step) and the simulator's node scheduler, built from the same EngineConfig
(`sim_config_for_engine`), compute the same token spans in every step while prompts arrive beside decodes."""

import dataclasses

import numpy as np
import pytest

from kvbench.engines.kvengine.core.plans import probe_shape
from kvbench.engines.kvengine.core.scheduler import Request, RequestId, ScheduledSeq
from kvbench.engines.kvengine.runtime.budget_probe import build_engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig
from kvbench.sim.cost import SeqWork
from kvbench.sim.fleet import build_nodes, prefill_beside_decodes
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.validate import sim_config_for_engine

BUDGET = 16
SETTINGS = EngineConfig(
    model="tiny-random",
    kv_capacity=2048,
    max_num_seqs=4,
    max_step_tokens=256,
    max_prefill_beside_decodes=BUDGET,
    threads=1,
)
# step -> (request, prompt length, tokens to generate): b and c arrive while a (then b) decode
ARRIVALS = {0: [("a", 40, 30)], 3: [("b", 100, 12)], 5: [("c", 70, 6)]}


def prompt(rid: str, n: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng(ord(rid)).integers(1, 500, n).tolist())


def engine_steps(settings: EngineConfig = SETTINGS) -> tuple[list[tuple[tuple[int, int], ...]], EngineConfig]:
    """The token spans of every step, and the engine's settings as it ran (auto resolved)."""
    engine = build_engine(settings)
    steps: list = []
    engine.step_listeners.append(lambda timing: steps.append(timing.work))
    t = 0
    try:
        while t <= max(ARRIVALS) or engine.has_work():
            for rid, n, out in ARRIVALS.get(t, []):
                engine.add(GenerationRequest(rid, prompt(rid, n), out, ignore_eos=True))
            engine.step()
            t += 1
    finally:
        engine.close()
    return steps, engine.config


def simulator_steps(settings: EngineConfig = SETTINGS) -> list[tuple[tuple[int, int], ...]]:
    config = sim_config_for_engine(settings, load_geometry("tiny-random"), load_hardware("cpu"))
    sched = build_nodes(config)[0].scheduler
    steps: list = []
    t = 0
    while t <= max(ARRIVALS) or sched.has_work():
        for rid, n, out in ARRIVALS.get(t, []):
            sched.add(Request(RequestId(rid), np.asarray(prompt(rid, n), np.int32), max_new_tokens=out))
        plan = sched.schedule_compact(float(t))
        starts = iter(plan.decode_starts)
        work = tuple((e.start, e.end) if type(e) is ScheduledSeq else (s := next(starts), s + 1) for e in plan.entries)
        if work:
            steps.append(work)
        sched.postprocess_compact(plan, [7] * len(plan.sampled_ids), t + 1.0)
        t += 1
    return steps


def test_the_simulator_takes_the_engine_steps_under_the_prefill_budget():
    real, _ = engine_steps()
    assert simulator_steps() == real
    decodes = [sum(1 for s, e in work if e - s == 1) for work in real]
    prefill = [sum(e - s for s, e in work if e - s > 1) for work in real]
    mixed = [p for d, p in zip(decodes, prefill) if d and p]
    assert mixed and max(mixed) == BUDGET  # prompts joined beside decodes, in chunks of the budget
    assert max(prefill) > BUDGET  # and a step without decodes prefilled beyond it (a's whole prompt)


def test_an_auto_budget_reaches_the_simulator_as_the_engine_timed_it():
    """`auto` is timed by the engine at start; the engine's settings then carry the number, and the simulator
    built from them takes the same steps. The unresolved setting is refused with the fix named."""
    auto = dataclasses.replace(SETTINGS, max_prefill_beside_decodes=AUTO)
    real, ran = engine_steps(auto)
    assert isinstance(ran.max_prefill_beside_decodes, int)
    assert simulator_steps(ran) == real
    with pytest.raises(ValueError, match="max_prefill_beside_decodes is auto.*kvbench:prefill_beside_decodes_tokens"):
        sim_config_for_engine(auto, load_geometry("tiny-random"), load_hardware("cpu"))


@pytest.mark.parametrize(
    "hardware, model", [("cpu", "smollm2-135m"), ("h200", "llama-3.3-70b"), ("h200", "smollm2-135m")]
)
def test_auto_on_the_cost_model_keeps_a_mixed_step_within_the_factor(hardware, model):
    """The simulator resolves `auto` on its cost model by the engine's rule: beside one decode, a prefill chunk
    of the resolved size costs at most decode_stall_factor x the decode step alone, and is within a tenth of the
    largest that does (or the probe's ceiling binds)."""
    settings = dataclasses.replace(SETTINGS, max_prefill_beside_decodes=7, max_step_tokens=2048)
    config = sim_config_for_engine(settings, load_geometry(model), load_hardware(hardware))
    config = dataclasses.replace(config, preset=dataclasses.replace(config.preset, max_prefill_beside_decodes=AUTO))
    n = prefill_beside_decodes(config, config.device_pages())
    shape = probe_shape(config.preset.max_step_tokens, config.device_pages() * config.preset.page_size)
    decode = SeqWork(shape.context, shape.context + 1)

    def mixed(tokens: int) -> float:
        return config.cost.step([decode, SeqWork(tokens, 2 * tokens)]).seconds

    alone, factor = config.cost.step([decode]).seconds, config.preset.decode_stall_factor
    best = max((k for k in range(1, shape.ceiling + 1) if mixed(k) <= factor * alone), default=1)
    assert mixed(n) <= factor * alone * 1.001
    assert 0.9 * best <= n <= best  # within a tenth of the largest chunk the cost model allows
    assert build_nodes(config)[0].scheduler.config.max_prefill_beside_decodes == n
