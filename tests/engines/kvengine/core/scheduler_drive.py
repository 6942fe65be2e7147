"""A driver of the scheduler through its three paths, as the engine and the simulator drive it: `schedule` /
`postprocess` (the engine, `runtime/engine.py`), `schedule_compact` / `postprocess_compact` (the simulator's
step, `sim/node.py`) and decode runs committed in one pass (`decode_run` / `commit_decode_run`, the simulator's
`fast_forward`). Requests arrive at given steps; each sampled token is a fixed function of the request and
its position, so every path samples the same; `check_integrity()` runs after every step (and every run)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Request, ScheduledSeq, Scheduler, SchedulerConfig

ENGINE, COMPACT, RUNS = "engine", "compact", "runs"


def token(rid: str, k: int) -> int:
    """The k-th token sampled for `rid` (no stop tokens: only lengths finish a request)."""
    return (k * 31 + sum(map(ord, rid)) * 7) % 1000 + 1000  # never a prompt token (those are < 1000)


def compact_items(plan) -> list[tuple]:
    """A CompactPlan's entries as `schedule` would have given them (a decode covers [s, s + 1))."""
    starts = iter(plan.decode_starts)
    out = []
    for e in plan.entries:
        if type(e) is ScheduledSeq:
            out.append((e.request_id, e.start, e.end, tuple(e.page_table)))
        else:
            s = next(starts)
            out.append((e.request.request_id, s, s + 1, e.page_table()))
    return out


@dataclass
class Drive:
    """Plays `arrivals` (step -> requests) on a pool of `num_pages` pages through `path`."""

    num_pages: int
    page_size: int
    arrivals: dict[int, list[Request]]
    path: str = ENGINE
    config: SchedulerConfig = SchedulerConfig()
    max_steps: int = 2000
    sched: Scheduler = field(init=False)
    plans: dict = field(default_factory=dict)  # step -> [(request, start, end, page table)]
    preempted: list = field(default_factory=list)  # (step, request)
    finished: dict = field(default_factory=dict)  # request -> output
    _produced: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sched = Scheduler(PrefixIndex(PagePool(self.num_pages, self.page_size)), self.config)

    def sample(self, rid: str) -> int:
        k = self._produced.get(rid, 0)
        self._produced[rid] = k + 1
        return token(rid, k)

    def _done(self, finished) -> None:
        self.finished.update({f.request_id: f.output for f in finished})

    def _step(self, t: int) -> None:
        if self.path == ENGINE:
            plan = self.sched.schedule(float(t))
            self.plans[t] = [(s.request_id, s.start, s.end, s.page_table) for s in plan.seqs]
            sampled = {s.request_id: self.sample(s.request_id) for s in plan.seqs if s.samples}
            self._done(self.sched.postprocess(plan, sampled, t + 1.0))
        else:
            plan = self.sched.schedule_compact(float(t))
            self.plans[t] = compact_items(plan)
            self._done(self.sched.postprocess_compact(plan, [self.sample(r) for r in plan.sampled_ids], t + 1.0))
        self.preempted.extend((t, rid) for rid in plan.preempted)

    def _run(self, t: int, horizon: int) -> int | None:
        """Carry out a decode run from step t up to `horizon` (steps); the step after it, or None if none."""
        run = self.sched.decode_run()
        if run is None:
            return None
        k = min(run.steps, horizon - t)
        tokens = [[self.sample(rid) for _ in range(k - 1)] for rid in run.request_ids]
        plan = self.sched.commit_decode_run(run, [float(t + j) for j in range(k)], tokens)
        t += k - 1
        self.plans[t] = compact_items(plan)
        self._done(self.sched.postprocess_compact(plan, [self.sample(r) for r in plan.sampled_ids], t + 1.0))
        return t + 1

    def play(self) -> "Drive":
        t = 0
        while t < self.max_steps and (self.sched.has_work() or any(s >= t for s in self.arrivals)):
            for request in self.arrivals.get(t, []):
                self.sched.add(request)
            after = None
            if self.path == RUNS:
                horizon = min((s for s in self.arrivals if s > t), default=self.max_steps)
                after = self._run(t, horizon)
            if after is None:
                self._step(t)
                t += 1
            else:
                t = after
            self.sched.check_integrity()
        return self


def prompt(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n, dtype=np.int32)
