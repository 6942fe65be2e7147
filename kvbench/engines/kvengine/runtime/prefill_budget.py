"""max_prefill_beside_decodes `auto`: time, on the engine as built, a pure decode step and the same step with
prefill chunks of growing size beside it, and take the core's rule (`core.plans.stall_bounded_prefill`).

The probe runs before the engine serves anything. For each chunk size the rule asks for, one request decodes
while a second one's prompt is prefilled beside it in PROBE_CHUNKS chunks of that size; then the first decodes
alone (`core.plans.probe_shape` keeps it all within the step budget and the device KV). The first size runs
once untimed first (allocator and kernel warm-up); each step time is the median of its kind. It runs with
prefix caching off: nothing it computed stays cached or reaches a lower tier.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from kvbench.engines.kvengine.core.plans import PROBE_CHUNKS, ProbeShape, probe_shape, stall_bounded_prefill
from kvbench.engines.kvengine.runtime.requests import GenerationRequest

if TYPE_CHECKING:
    from kvbench.engines.kvengine.runtime.engine import Engine, StepTiming


@dataclass(frozen=True, slots=True)
class PrefillBudget:
    """What the probe timed and what the rule made of it."""

    step_s: tuple[tuple[int, float], ...]  # (prefill tokens beside one decode, median step seconds), 0 first
    factor: float
    tokens: int  # the resolved max_prefill_beside_decodes

    def describe(self) -> str:
        timed = ", ".join(f"{n} tokens {seconds * 1e3:.1f} ms" for n, seconds in self.step_s)
        return (f"{self.tokens} prefill tokens beside running decodes (decode_stall_factor {self.factor:g}; "
                f"a decode step with prefill beside it: {timed})")


def measure_prefill_budget(engine: Engine, factor: float) -> PrefillBudget:
    """Time the probe on an idle `engine` and return the budget the rule gives; the engine's scheduler is
    left as it was (the caller sets the budget)."""
    if engine.has_work():
        raise ValueError("measure_prefill_budget needs an idle engine: it would time other requests' steps too")
    before = engine.scheduler.config
    shape = probe_shape(before.max_step_tokens, engine.pool.capacity * engine.pool.page_size)
    rng = np.random.default_rng(0)
    timed: dict[int, float] = {}

    def step_s(n: int) -> float:
        if n not in timed:
            chunk = n or shape.first
            if not timed:
                _probe_round(engine, rng, shape, chunk)  # warm-up, untimed
            decode_s, mixed_s = _probe_round(engine, rng, shape, chunk)
            timed.setdefault(0, decode_s)
            timed[chunk] = mixed_s
        return timed[n]

    try:
        tokens = stall_bounded_prefill(step_s, shape, factor)
    finally:
        engine.scheduler.config = before
    return PrefillBudget(tuple(sorted(timed.items())), factor, tokens)


def _probe_round(engine: Engine, rng: np.random.Generator, shape: ProbeShape, chunk: int) -> tuple[float, float]:
    """One decode beside PROBE_CHUNKS prefill chunks of `chunk` tokens, then alone: the median seconds of a
    pure decode step and of a mixed one."""
    # nothing the probe computes is cached (nor written to a lower or shared tier)
    engine.scheduler.config = replace(engine.scheduler.config, max_prefill_beside_decodes=chunk,
                                      prefix_caching=False)
    vocab = engine.loaded.config.vocab_size

    def prompt(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(0, vocab, n))

    # its tokens: one from its prefill, one beside each chunk, then PROBE_CHUNKS alone
    engine.add(GenerationRequest("budget-probe-decode", prompt(shape.context), 2 * PROBE_CHUNKS + 1,
                                 ignore_eos=True))
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
