"""max_prefill_beside_decodes `auto`: time a pure decode step and the same step with prefill chunks of growing
size beside it, and take the core's rule (`core.plans.stall_bounded_prefill`).

`measure_prefill_budget` knows no engine: it is given the round to time (a function of the chunk size that
returns the median seconds of a pure decode step and of a mixed one), and walks the sizes the rule asks for.
The first size runs once untimed first (allocator and kernel warm-up). `runtime/budget_probe.py` gives it our
engine's steps, once the engine is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvbench.engines.kvengine.core.plans import ProbeShape, stall_bounded_prefill


@dataclass(frozen=True, slots=True)
class PrefillBudget:
    """What the probe timed and what the rule made of it."""

    step_s: tuple[tuple[int, float], ...]  # (prefill tokens beside one decode, median step seconds), 0 first
    factor: float
    tokens: int  # the resolved max_prefill_beside_decodes

    def describe(self) -> str:
        timed = ", ".join(f"{n} tokens {seconds * 1e3:.1f} ms" for n, seconds in self.step_s)
        return (
            f"{self.tokens} prefill tokens beside running decodes (decode_stall_factor {self.factor:g}; "
            f"a decode step with prefill beside it: {timed})"
        )


def measure_prefill_budget(
    time_round: Callable[[int], tuple[float, float]], shape: ProbeShape, factor: float
) -> PrefillBudget:
    """The budget the rule gives for `shape` and `factor`, timing `time_round(chunk)` (the median seconds of a
    pure decode step and of a decode step beside a prefill chunk of `chunk` tokens) at each size it asks for."""
    timed: dict[int, float] = {}

    def step_s(n: int) -> float:
        if n not in timed:
            chunk = n or shape.first
            if not timed:
                time_round(chunk)  # warm-up, untimed
            decode_s, mixed_s = time_round(chunk)
            timed.setdefault(0, decode_s)
            timed[chunk] = mixed_s
        return timed[n]

    tokens = stall_bounded_prefill(step_s, shape, factor)
    return PrefillBudget(tuple(sorted(timed.items())), factor, tokens)
