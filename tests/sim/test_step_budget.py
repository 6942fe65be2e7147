"""The simulator schedules our engine's steps under its prefill budget beside decodes: the real engine (tiny
random weights, driven step by step) and the simulator's node scheduler, built from the same EngineConfig
(`sim_config_for_engine`), compute the same token spans in every step while prompts arrive beside decodes."""

import numpy as np

from kvbench.engines.kvengine.config import EngineConfig
from kvbench.engines.kvengine.core.scheduler import Request, RequestId, ScheduledSeq
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.sim.engine import build_nodes
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.validate import sim_config_for_engine

BUDGET = 16
SETTINGS = EngineConfig(model="tiny-random", kv_capacity=2048, max_num_seqs=4, max_step_tokens=256,
                        max_prefill_beside_decodes=BUDGET, threads=1)
# step -> (request, prompt length, tokens to generate): b and c arrive while a (then b) decode
ARRIVALS = {0: [("a", 40, 30)], 3: [("b", 100, 12)], 5: [("c", 70, 6)]}


def prompt(rid: str, n: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng(ord(rid)).integers(1, 500, n).tolist())


def engine_steps() -> list[tuple[tuple[int, int], ...]]:
    engine = Engine(SETTINGS)
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
    return steps


def simulator_steps() -> list[tuple[tuple[int, int], ...]]:
    config = sim_config_for_engine(SETTINGS, load_geometry("tiny-random"), load_hardware("cpu"))
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
    real = engine_steps()
    assert simulator_steps() == real
    decodes = [sum(1 for s, e in work if e - s == 1) for work in real]
    prefill = [sum(e - s for s, e in work if e - s > 1) for work in real]
    mixed = [p for d, p in zip(decodes, prefill) if d and p]
    assert mixed and max(mixed) == BUDGET  # prompts joined beside decodes, in chunks of the budget
    assert max(prefill) > BUDGET  # and a step without decodes prefilled beyond it (a's whole prompt)
