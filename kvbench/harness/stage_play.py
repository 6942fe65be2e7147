"""One load stage played against a real server (`measure/stages.py`): its parts one after the other, each drained.

A measured stage is a load point of its own (`StagedLoad`). Its parts, in order (the first stage's warm-up,
then the stage): the part's sessions of the workload start at the plan's Poisson offsets from the part's
start; the part is over when every one of them has finished (the load generator returns only then: the
drain); the next part starts `plan.gap_s` later. A warm-up part's requests are all marked warm-up, so its
records, written under the point's run id as they finish, are left out of every metric. Every part of a
ladder continues one oracle (`StageChain`), as the server keeps its cache from stage to stage.

    point "20/s x 0.5 s"                                point "40/s x 0.5 s"
    | reset | warm-up 20/s x 0.5 s | drain | gap | stage | drain |  gap | stage (no reset) | drain |
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvbench.harness import eventloop
from kvbench.harness.loadgen import LoadGenerator, LoadResult
from kvbench.measure.conversation import ReuseOracle
from kvbench.measure.records import RecordWriter, RequestRecord
from kvbench.measure.schedule import LoadSpec
from kvbench.measure.stages import StagedLoad
from kvbench.workloads.spec import Session, Workload


@dataclass(slots=True)
class StageChain:
    """The oracle of the ladder being played: a later stage continues the one the stage before it left."""

    oracle: ReuseOracle | None = None

    def oracle_for(self, staged: StagedLoad, generator: LoadGenerator) -> ReuseOracle:
        """The first stage (or a later one with no stage before it played here: a resumed run) starts anew."""
        if not staged.keeps_cache or self.oracle is None:
            self.oracle = generator.new_oracle()
        return self.oracle


def play_stage(
    generator: LoadGenerator,
    workload: Workload,
    staged: StagedLoad,
    seed: int,
    oracle: ReuseOracle,
    writer: RecordWriter | None,
    on_record: Callable[[RequestRecord], None] | None,
    finished: Sequence[RequestRecord] = (),
) -> LoadResult:
    """Play `staged`'s parts (module docstring) with `generator`'s endpoint and run id; one result for the point.
    A later stage waits `gap_s` first; a part that aborts ends the point."""
    results: list[LoadResult] = []
    for number, part in enumerate(staged.parts(seed)):
        if number or staged.keeps_cache:
            time.sleep(staged.plan.gap_s)
        sessions = part.sessions_of(workload.sessions)
        warmup = sum(len(session.turns) for session in sessions) if part.warmup else 0
        player = dataclasses.replace(generator, load=LoadSpec(rate=part.stage.rate, warmup_requests=warmup))
        results.append(
            eventloop.run(
                player.run(
                    dataclasses.replace(workload, sessions=tuple(sessions)),
                    writer,
                    on_record,
                    finished,
                    offsets=part.offsets,
                    oracle=oracle,
                )
            )
        )
        if results[-1].aborted is not None:
            break
    return joined(generator, results)


def stage_sessions(workload: Workload, staged: StagedLoad) -> list[Session]:
    """Every session the point plays, in order (the first stage's warm-up ones first)."""
    return [session for part in staged.parts(seed=0) for session in part.sessions_of(workload.sessions)]


def joined(generator: LoadGenerator, results: Sequence[LoadResult]) -> LoadResult:
    """Parts played one after another as one result: their records in order, the client's check over all their
    lags, the first abort."""
    sources: dict[str, int] = {}
    for result in results:
        for source, count in result.answer_sources.items():
            sources[source] = sources.get(source, 0) + count
    schedule = tuple(lag for result in results for lag in result.schedule_lags_ms)
    loop = tuple(lag for result in results for lag in result.loop_lags_ms)
    return LoadResult(
        records=tuple(record for result in results for record in result.records),
        client=generator.check(schedule, loop, [record for result in results for record in result.records]),
        aborted=next((result.aborted for result in results if result.aborted is not None), None),
        answer_sources=sources,
        replayed=tuple(record for result in results for record in result.replayed),
        schedule_lags_ms=schedule,
        loop_lags_ms=loop,
        missed_arrivals=sum(result.missed_arrivals for result in results),
    )
