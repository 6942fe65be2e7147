"""The step probe records exactly the work of every model step, for the simulator's calibration."""

from kvbench.engines.kvengine.runtime.engine import Engine, EngineConfig
from kvbench.engines.kvengine.runtime.step_probe import ProbeCase, probe_steps


def test_every_step_is_recorded_with_the_token_ranges_it_computed():
    engine = Engine(EngineConfig(model="tiny-random", kv_capacity_tokens=4096, max_step_tokens=512))
    steps = probe_steps(engine, [ProbeCase(1024, batch=1, max_tokens=3), ProbeCase(100, batch=3, max_tokens=2)])
    works = [step.work for step in steps]
    assert works == [
        ((0, 512),), ((512, 1024),), ((1024, 1025),), ((1025, 1026),),  # chunked prefill, then two decodes
        ((0, 100), (0, 100), (0, 100)), ((100, 101), (100, 101), (100, 101)),  # a batch of three
    ]
    assert all(step.seconds > 0 for step in steps)
    assert not engine.has_work() and engine.step_listeners == []


def test_cases_start_from_an_empty_cache():
    """Same-length random prompts in a row: nothing is reused, so every case prefills from token 0."""
    engine = Engine(EngineConfig(model="tiny-random", kv_capacity_tokens=4096, max_step_tokens=512))
    steps = probe_steps(engine, [ProbeCase(64), ProbeCase(64)], warmup=False)
    assert [step.work for step in steps] == [((0, 64),), ((0, 64),)]
