"""Our engine as its callers get it (`build_engine`): built, then, where max_prefill_beside_decodes is `auto`, its
prefill budget timed on its own steps and set (`probe_prefill_budget`).

For each chunk size the rule (`prefill_budget`) asks for, one request decodes while a second one's prompt is
prefilled beside it in PROBE_CHUNKS chunks of that size; then the first decodes alone (`core.plans.probe_shape`
keeps it all within the step budget and the device KV); each step time is the median of its kind. It runs with
prefix caching off: nothing it computed stays cached or reaches a lower tier; the engine's metrics start afresh
after it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from kvbench.engines.kvengine.core.plans import PROBE_CHUNKS, ProbeShape, probe_shape
from kvbench.engines.kvengine.model.loader import LoadedModel
from kvbench.engines.kvengine.runtime.engine import Engine, StepTiming
from kvbench.engines.kvengine.runtime.model_runner import Ranks
from kvbench.engines.kvengine.runtime.prefill_budget import PrefillBudget, measure_prefill_budget
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig


def build_engine(
    config: EngineConfig,
    loaded: LoadedModel | None = None,
    clock: Callable[[], float] = time.monotonic,
    ranks: Ranks = Ranks(),
) -> Engine:
    """`Engine(config, ...)`, its prefill budget timed and set when the config says `auto`."""
    engine = Engine(config, loaded, clock, ranks)
    if engine.config.max_prefill_beside_decodes == AUTO:
        probe_prefill_budget(engine)
    return engine


def probe_prefill_budget(engine: Engine) -> PrefillBudget:
    """Time the probe on an idle `engine` and set the budget the rule gives (`Engine.use_prefill_budget`)."""
    if engine.has_work():
        raise ValueError("probe_prefill_budget needs an idle engine: it would time other requests' steps too")
    before = engine.scheduler.config
    shape = probe_shape(before.max_step_tokens, engine.pool.capacity * engine.pool.page_size)
    rng = np.random.default_rng(0)
    try:
        budget = measure_prefill_budget(
            lambda chunk: _probe_round(engine, rng, shape, chunk), shape, engine.config.decode_stall_factor
        )
    finally:
        engine.scheduler.config = before
    engine.use_prefill_budget(budget)
    return budget


def _probe_round(engine: Engine, rng: np.random.Generator, shape: ProbeShape, chunk: int) -> tuple[float, float]:
    """One decode beside PROBE_CHUNKS prefill chunks of `chunk` tokens, then alone: the median seconds of a
    pure decode step and of a mixed one."""
    # nothing the probe computes is cached (nor written to a lower or shared tier)
    engine.scheduler.config = replace(engine.scheduler.config, max_prefill_beside_decodes=chunk, prefix_caching=False)
    vocab = engine.loaded.config.vocab_size

    def prompt(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(0, vocab, n))

    # its tokens: one from its prefill, one beside each chunk, then PROBE_CHUNKS alone
    engine.add(GenerationRequest("budget-probe-decode", prompt(shape.context), 2 * PROBE_CHUNKS + 1, ignore_eos=True))
    engine.step()  # its prefill, in one step (at most the step budget)
    engine.add(GenerationRequest("budget-probe-prefill", prompt(PROBE_CHUNKS * chunk), 1, ignore_eos=True))
    steps = steps_until_idle(engine)
    decode = [s.seconds for s in steps if _shape(s) == (1,)]
    mixed = [s.seconds for s in steps if _shape(s) == (1, chunk)]
    if not decode or not mixed:
        raise RuntimeError(f"prefill budget probe: expected pure decode and mixed steps, got {[s.work for s in steps]}")
    return statistics.median(decode), statistics.median(mixed)


def steps_until_idle(engine: Engine) -> list[StepTiming]:
    """Step `engine` until it has no work; the timing of every step that ran the model."""
    steps: list[StepTiming] = []
    engine.step_listeners.append(steps.append)
    try:
        while engine.has_work():
            engine.step()
    finally:
        engine.step_listeners.remove(steps.append)
    return steps


def _shape(timing: StepTiming) -> tuple[int, ...]:
    return tuple(sorted(end - start for start, end in timing.work))
