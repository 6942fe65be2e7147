"""Timed steps of our engine, for fitting the simulator's hardware profile: on a fixed set of request shapes
in this process (`probe_steps`), or as the engine serves (`StepLog`, read back by `read_step_log`).

Each case submits `batch` requests of `prompt_tokens` fresh random tokens (no cache hits) that generate
`max_tokens` tokens each, and steps the engine until they finish. Every step that ran the model is
recorded as a `StepTiming` (the token ranges it computed, its wall seconds), so one case yields prefill
chunks, mixed steps and decode steps alike. The default cases cover long and short prefills, chunked
prefill over a cached context, and decode batches of 1-8 sequences at short and long contexts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.engines.kvengine.runtime.budget_probe import steps_until_idle
from kvbench.engines.kvengine.runtime.engine import Engine, StepTiming
from kvbench.engines.kvengine.runtime.requests import GenerationRequest


@dataclass(frozen=True, slots=True)
class ProbeCase:
    prompt_tokens: int
    batch: int = 1
    max_tokens: int = 1


DEFAULT_CASES: tuple[ProbeCase, ...] = (
    ProbeCase(64),
    ProbeCase(128),
    ProbeCase(256),
    ProbeCase(512),
    ProbeCase(1024),
    ProbeCase(2048),
    ProbeCase(128, batch=1, max_tokens=16),
    ProbeCase(128, batch=4, max_tokens=16),
    ProbeCase(128, batch=8, max_tokens=16),
    ProbeCase(512, batch=1, max_tokens=16),
    ProbeCase(512, batch=8, max_tokens=16),
    ProbeCase(1024, batch=4, max_tokens=16),
    ProbeCase(2048, batch=2, max_tokens=16),
)


def probe_steps(
    engine: Engine, cases: Sequence[ProbeCase] = DEFAULT_CASES, seed: int = 0, warmup: bool = True
) -> list[StepTiming]:
    """Run `cases` one after another on an idle `engine`; returns the timing of every model step.

    The engine's prefix cache is emptied before each case so that nothing is reused. With `warmup`, the first
    case runs once unrecorded first (the first steps pay for allocator and kernel warm-up)."""
    if engine.has_work():
        raise ValueError("probe_steps needs an idle engine: it would time other requests' steps too")
    rng = np.random.default_rng(seed)
    vocab = engine.loaded.config.vocab_size
    timings: list[StepTiming] = []
    plan = ([cases[0]] if warmup and cases else []) + list(cases)
    for number, case in enumerate(plan):
        engine.reset_prefix_cache()
        for i in range(case.batch):
            prompt = tuple(int(t) for t in rng.integers(0, vocab, case.prompt_tokens))
            engine.add(GenerationRequest(f"probe-{number}-{i}", prompt, case.max_tokens, ignore_eos=True))
        steps = steps_until_idle(engine)
        if not (warmup and number == 0):
            timings.extend(steps)
    return timings


@dataclass(slots=True)
class StepLog:
    """A step listener that appends each step as a JSON line: {"work": [[start, end], ...], "seconds": s}.
    Flushed per line, so the log survives the server being stopped."""

    path: Path

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, timing: StepTiming) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"work": timing.work, "seconds": timing.seconds}, separators=(",", ":")) + "\n")


def read_step_log(path: Path) -> list[StepTiming]:
    """The steps a `StepLog` wrote; a line that is not a step names the file and line."""
    steps = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            data = json.loads(line)
            steps.append(StepTiming(tuple((int(a), int(b)) for a, b in data["work"]), float(data["seconds"])))
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"{path}:{number}: not a step line ({line[:60]!r}); expected "
                '{"work": [[start, end], ...], "seconds": s}'
            ) from None
    return steps
