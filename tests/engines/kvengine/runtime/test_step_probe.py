"""The step probe records exactly the work of every model step, for the simulator's calibration."""

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.step_probe import ProbeCase, probe_steps
from kvbench.engines.kvengine.settings.config import EngineConfig


def test_every_step_is_recorded_with_the_token_ranges_it_computed():
    engine = Engine(EngineConfig(model="tiny-random", kv_capacity=4096, max_step_tokens=512))
    steps = probe_steps(engine, [ProbeCase(1024, batch=1, max_tokens=3), ProbeCase(100, batch=3, max_tokens=2)])
    works = [step.work for step in steps]
    assert works == [
        ((0, 512),),
        ((512, 1024),),
        ((1024, 1025),),
        ((1025, 1026),),  # chunked prefill, then two decodes
        ((0, 100), (0, 100), (0, 100)),
        ((100, 101), (100, 101), (100, 101)),  # a batch of three
    ]
    assert all(step.seconds > 0 for step in steps)
    assert not engine.has_work() and engine.step_listeners == []


def test_cases_start_from_an_empty_cache():
    """Same-length random prompts in a row: nothing is reused, so every case prefills from token 0."""
    engine = Engine(EngineConfig(model="tiny-random", kv_capacity=4096, max_step_tokens=512))
    steps = probe_steps(engine, [ProbeCase(64), ProbeCase(64)], warmup=False)
    assert [step.work for step in steps] == [((0, 64),), ((0, 64),)]


def test_the_step_log_reads_back_what_the_engine_stepped(tmp_path):
    from kvbench.engines.kvengine.runtime.step_probe import StepLog, read_step_log

    engine = Engine(EngineConfig(model="tiny-random", kv_capacity=4096, max_step_tokens=512))
    seen = []
    engine.step_listeners += [StepLog(tmp_path / "steps.jsonl"), seen.append]
    probe_steps(engine, [ProbeCase(600, batch=2, max_tokens=2)], warmup=False)
    assert read_step_log(tmp_path / "steps.jsonl") == seen and len(seen) >= 3


def test_a_bad_step_log_line_names_the_file_and_line(tmp_path):
    import pytest

    from kvbench.engines.kvengine.runtime.step_probe import read_step_log

    path = tmp_path / "steps.jsonl"
    path.write_text('{"work": [[0, 8]], "seconds": 0.1}\n{"work": "oops"}\n')
    with pytest.raises(ValueError, match=r"steps.jsonl:2: not a step line"):
        read_step_log(path)
