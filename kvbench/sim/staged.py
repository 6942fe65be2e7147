"""A simulated run over load stages (`measure/stages.py`): one fleet, its caches kept from stage to stage.

Stage s starts its requests (sessions of the workload, in order: stage 0 takes the first `requests` of them)
at its Poisson offsets from the stage's start; when all have finished, the next stage starts `gap_s` later, as
inference-perf runs a ladder. `max_concurrency` caps the requests in flight (see `engine.py`: past it a due request
waits in the client, its TTFT counted from the send). The warm-up stage's records are marked warm-up. Results come per stage: each
stage's records summarized on their own (`stage_summaries`), so throughput is the stage's output tokens over
its first send to its last completion, as inference-perf reports it per stage.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.measure.metrics import Summary, summarize_run
from kvbench.measure.records import RequestRecord
from kvbench.measure.schedule import LoadSpec
from kvbench.measure.stages import StagePlan
from kvbench.sim.config import SimConfig
from kvbench.sim.engine import NS, SimResult, new_sim, sim_result
from kvbench.sim.gc_pause import collector_paused
from kvbench.workloads.spec import Workload


@dataclass(frozen=True, slots=True)
class StagedResult:
    """The whole run (`result`, warm-up records included and marked) and each measured stage's records."""

    plan: StagePlan
    result: SimResult
    stage_records: tuple[tuple[RequestRecord, ...], ...]  # per measured stage, in `plan.stages` order

    def stage_summaries(self) -> list[Summary]:
        return [summarize_run(list(records)).overall for records in self.stage_records]


def check_enough(workload: Workload, plan: StagePlan) -> None:
    """ValueError when the workload has fewer sessions than the stages send requests."""
    plan.require_sessions(len(workload.sessions))


def simulate_stages(
    workload: Workload,
    plan: StagePlan,
    config: SimConfig,
    run_id: str = "sim",
    seed: int = 0,
    stage_subset: Sequence[int] | None = None,
    max_concurrency: int | None = None,
) -> StagedResult:
    """Play `plan` on `config`'s fleet (module docstring). Deterministic for the same inputs.

    `stage_subset` (indices into `plan.stages`) plays only those measured stages, after the warm-up: a cheaper
    run for a fit over part of a ladder (a skipped stage's requests are not sent, and the cache it would have
    left is missing)."""
    check_enough(workload, plan)
    started = time.perf_counter()
    # Trace mode: the offsets come from the stages.
    load = LoadSpec(warmup_requests=plan.warmup_requests, max_concurrency=max_concurrency)
    sim = new_sim(workload, load, config, run_id, seed)
    bounds = plan.first_request()
    arrivals = plan.arrivals(seed)
    skip_first = 1 if plan.warmup is not None else 0
    wanted = set(range(len(plan.stages)) if stage_subset is None else stage_subset)
    per_stage: list[list[RequestRecord]] = []
    start = 0.0
    with collector_paused():
        for position, stage in enumerate(plan.all_stages):
            measured = position - skip_first
            if measured >= 0 and measured not in wanted:
                continue
            first = bounds[position]
            indices = list(range(first, first + stage.requests))
            offsets = {index: start + float(arrivals[position][index - first]) for index in indices}
            before = len(sim.records)
            sim.play(indices, offsets)
            sim.report_unfinished()
            records = sim.records[before:]
            if measured >= 0:
                per_stage.append(records)
            end = max((r.done_ns or r.sent_ns or 0 for r in records), default=0) / NS
            start = max(end, start) + plan.gap_s
    result = sim_result(sim, started)
    if stage_subset is not None:
        plan = dataclasses.replace(plan, stages=tuple(plan.stages[i] for i in sorted(wanted)))
    return StagedResult(plan, result, tuple(tuple(sorted(r, key=lambda x: x.queued_ns)) for r in per_stage))
