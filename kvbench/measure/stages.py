"""Load stages: a ladder of Poisson rates, each for a while, after an optional warm-up left out of results.

The stages are run as inference-perf runs them (`load.type: poisson` with `stages:`): stage s sends
`round(rate * duration)` requests whose gaps are exponential with mean 1/rate (the first at the stage's start),
then waits until every one of them has finished, then pauses `gap_s` (inference-perf's `interval`, 1 s) before
the next stage starts. The server keeps its cache across stages. Request k of the run belongs to the stage
whose request counts, in order, cover k; the warm-up stage's requests are marked warm-up and left out of every
metric.

    | warm-up 15/s x 50 s | drain | 1 s | 3/s x 20 s | drain | 1 s | 10/s x 20 s | drain | ...
      requests 0..749             (warmup)  750..809                  810..1009

Written `RATE:SECONDS`, comma-separated: `--stages 3:20,10:20,15:20 --warmup-stage 15:50`. A "request" here is
the start of a session of the workload, in the workload's order (stage 0 takes the first `requests` of them):
one request for a single-turn workload such as shared-prefix; a multi-turn session plays all its turns.

Against a real server (`kvbench run --stages`), each measured stage is a load point of its own (`StagedLoad`):
the first one also plays the warm-up before it, recorded under its point and marked warm-up; the ones after it
skip the cache reset before a point, as the simulator's fleet keeps its cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

STAGE_EXAMPLE = "3:20,10:20,15:20"
STAGE_GAP_S = 1.0
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stage:
    """Poisson arrivals at `rate` requests per second for `duration_s` seconds."""

    rate: float
    duration_s: float

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.duration_s > 0):
            raise ValueError(
                f"stage {self.rate:g}:{self.duration_s:g}: rate and seconds must both be > 0, e.g. {STAGE_EXAMPLE}"
            )

    @property
    def requests(self) -> int:
        return max(int(round(self.rate * self.duration_s)), 1)

    @property
    def label(self) -> str:
        return f"{self.rate:g}/s x {self.duration_s:g} s"


@dataclass(frozen=True, slots=True)
class StagePlan:
    """The measured stages in order, and the warm-up stage before them (None: no warm-up)."""

    stages: tuple[Stage, ...]
    warmup: Stage | None = None
    gap_s: float = STAGE_GAP_S

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError(f"no load stage given; write e.g. {STAGE_EXAMPLE}")

    @classmethod
    def parse(cls, stages: str, warmup: str | None = None) -> StagePlan:
        """The plan `--stages STAGES [--warmup-stage WARMUP]` (or a config load point's keys) write; ValueError
        naming the part that cannot be read."""
        return cls(parse_stages(stages), parse_stage(warmup) if warmup is not None else None)

    @property
    def all_stages(self) -> tuple[Stage, ...]:
        """The stages as they run: the warm-up first, when there is one."""
        return ((self.warmup,) if self.warmup is not None else ()) + self.stages

    @property
    def warmup_requests(self) -> int:
        return self.warmup.requests if self.warmup is not None else 0

    @property
    def total_requests(self) -> int:
        return sum(stage.requests for stage in self.all_stages)

    def first_request(self) -> list[int]:
        """The index of each stage's first request (in `all_stages` order), and the total at the end."""
        return [int(x) for x in np.cumsum([0] + [stage.requests for stage in self.all_stages])]

    def stage_of(self, request_index: int) -> int | None:
        """The measured stage (index into `stages`) request `request_index` belongs to; None for the warm-up
        and for indices past the last stage."""
        bounds = self.first_request()
        position = int(np.searchsorted(bounds, request_index, side="right")) - 1
        if position < 0 or position >= len(self.all_stages):
            return None
        position -= 1 if self.warmup is not None else 0
        return position if position >= 0 else None

    def require_sessions(self, available: int) -> None:
        """ValueError when a workload of `available` sessions is too short for the stages' requests."""
        if available < self.total_requests:
            raise ValueError(
                f"the stages send {self.total_requests:,} requests but the workload has "
                f"{available:,} sessions: generate at least that many (--num-sessions "
                f"{self.total_requests}; shared-prefix cycles its prompts)"
            )

    def points(self) -> tuple[StagedLoad, ...]:
        """The measured stages as load points, in order."""
        return tuple(StagedLoad(self, index) for index in range(len(self.stages)))

    def arrivals(self, seed: int) -> list[np.ndarray]:
        """Per stage (in `all_stages` order), its requests' send offsets from the stage's start, in seconds:
        exponential gaps with mean 1/rate, the first at 0, from a stream of its own per stage."""
        out = []
        for index, stage in enumerate(self.all_stages):
            gaps = np.random.default_rng([seed, 11, index]).exponential(1.0 / stage.rate, size=stage.requests)
            out.append(np.cumsum(gaps) - gaps[0])
        return out


@dataclass(frozen=True, slots=True)
class StagePart:
    """What one stage plays: the workload's sessions `first .. first + stage.requests - 1`, each started at its
    `offsets` entry (seconds from the stage's start); every request of a warm-up part is marked warm-up."""

    stage: Stage
    first: int
    offsets: tuple[float, ...]
    warmup: bool

    def sessions_of(self, sessions: Sequence[T]) -> Sequence[T]:
        """This part's sessions of the workload's (all of them, in the workload's order)."""
        return sessions[self.first : self.first + self.stage.requests]


@dataclass(frozen=True, slots=True)
class StagedLoad:
    """Measured stage `index` of `plan` as one load point. It plays `parts`: the warm-up first when it is the
    first stage, then its own stage; each part drained before the next, `plan.gap_s` between them."""

    plan: StagePlan
    index: int

    @property
    def stage(self) -> Stage:
        return self.plan.stages[self.index]

    @property
    def keeps_cache(self) -> bool:
        """True after the first stage: the server keeps the cache the stage before left (no reset), and the
        stage starts `plan.gap_s` after that stage drained."""
        return self.index > 0

    def parts(self, seed: int) -> tuple[StagePart, ...]:
        """The parts this point plays, in order, with the plan's arrivals for `seed` (module docstring)."""
        skip = 1 if self.plan.warmup is not None else 0
        positions = ([0] if skip and self.index == 0 else []) + [self.index + skip]
        bounds, arrivals = self.plan.first_request(), self.plan.arrivals(seed)
        return tuple(
            StagePart(
                self.plan.all_stages[position],
                bounds[position],
                tuple(float(offset) for offset in arrivals[position]),
                warmup=position < skip,
            )
            for position in positions
        )


def parse_stage(text: str) -> Stage:
    """`RATE:SECONDS` -> Stage; ValueError naming the part that cannot be read."""
    rate, sep, seconds = text.strip().partition(":")
    try:
        if not sep:
            raise ValueError
        return Stage(float(rate), float(seconds))
    except ValueError as error:
        if "stage" in str(error):
            raise
        raise ValueError(f"stage {text.strip()!r} is not RATE:SECONDS; write e.g. {STAGE_EXAMPLE}") from None


def parse_stages(text: str) -> tuple[Stage, ...]:
    """`3:20,10:20` -> stages in order."""
    stages = tuple(parse_stage(part) for part in text.split(",") if part.strip())
    if not stages:
        raise ValueError(f"no load stage given; write e.g. {STAGE_EXAMPLE}")
    return stages
