"""The scheduler's three ways through the same steps decide the same: `schedule`/`postprocess` (the engine),
`schedule_compact`/`postprocess_compact` (the simulator) and, where it offers one, a decode run committed in
one pass (`decode_run`/`commit_decode_run`, the simulator's fast-forward). Each is driven through a tiny pool
that forces evictions and preemptions, and compared step by step: the same sequences, spans, page ids,
preemptions and finished outputs."""

import numpy as np

from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Request, RequestId, ScheduledSeq, Scheduler, SchedulerConfig

PS = 16
STEPS = 160


def prompt(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n, dtype=np.int32)


def arrivals() -> dict[int, list[Request]]:
    """By step: a short request whose pages stay cached (evictable), then long decodes that outgrow the pool."""
    return {
        0: [Request(RequestId("short"), prompt(40, 1), max_new_tokens=2)],
        3: [
            Request(RequestId("a"), prompt(33, 2), max_new_tokens=70),
            Request(RequestId("b"), prompt(20, 3), max_new_tokens=60),
        ],
        30: [Request(RequestId("c"), prompt(18, 4), max_new_tokens=50)],
    }


def token(rid: str, k: int) -> int:
    """The k-th token sampled for `rid` (the same on every path: no stop tokens, so only lengths finish)."""
    return (k * 31 + len(rid) * 7) % 1000


def new_scheduler() -> Scheduler:
    return Scheduler(PrefixIndex(PagePool(1 + 12, PS)), SchedulerConfig(max_step_tokens=64))


def normalized(items) -> list[tuple]:
    return [(s.request_id, s.start, s.end, s.samples, tuple(s.page_table)) for s in items]


def compact_items(plan) -> list:
    """A CompactPlan's entries as the ScheduledSeqs `schedule` would have built (a decode covers [s, s + 1))."""
    starts = iter(plan.decode_starts)
    out = []
    for e in plan.entries:
        if type(e) is ScheduledSeq:
            out.append(e)
        else:
            s = next(starts)
            out.append(ScheduledSeq(e.request.request_id, e.page_table(), s, s + 1, 0, True))
    return out


class Driver:
    """Feeds the arrivals and the tokens; records each step's decisions and each finish."""

    def __init__(self) -> None:
        self.sched = new_scheduler()
        self.produced: dict[str, int] = {}
        self.plans: dict[int, tuple] = {}  # step -> (items, preempted)
        self.finished: dict[str, tuple[int, tuple[int, ...]]] = {}  # request -> (step, output)
        self.run_steps = 0

    def sample(self, rid: str) -> int:
        k = self.produced.get(rid, 0)
        self.produced[rid] = k + 1
        return token(rid, k)

    def finish(self, step: int, finished) -> None:
        for f in finished:
            self.finished[f.request_id] = (step, f.output)

    def engine_step(self, t: int) -> None:
        plan = self.sched.schedule(float(t))
        self.plans[t] = (normalized(plan.seqs), plan.preempted)
        sampled = {s.request_id: self.sample(s.request_id) for s in plan.seqs if s.samples}
        self.finish(t, self.sched.postprocess(plan, sampled, t + 1.0))
        self.sched.check_integrity()

    def compact_step(self, t: int) -> None:
        plan = self.sched.schedule_compact(float(t))
        self.plans[t] = (normalized(compact_items(plan)), plan.preempted)
        tokens = [self.sample(rid) for rid in plan.sampled_ids]
        self.finish(t, self.sched.postprocess_compact(plan, tokens, t + 1.0))

    def play(self, step, use_runs: bool = False) -> "Driver":
        due = arrivals()
        t = 0
        while t < STEPS:
            for request in due.get(t, []):
                self.sched.add(request)
            run = self.sched.decode_run() if use_runs else None
            if run is None:
                step(self, t)
                t += 1
                continue
            next_arrival = min((s for s in due if s > t), default=STEPS)
            k = min(run.steps, next_arrival - t, STEPS - t)
            tokens = [[self.sample(rid) for _ in range(k - 1)] for rid in run.request_ids]
            plan = self.sched.commit_decode_run(run, [float(t + j) for j in range(k)], tokens)
            self.run_steps += k - 1  # carried out in one pass; the last is planned, and committed below
            t += k - 1
            self.plans[t] = (normalized(compact_items(plan)), plan.preempted)
            tokens = [self.sample(rid) for rid in plan.sampled_ids]
            self.finish(t, self.sched.postprocess_compact(plan, tokens, t + 1.0))
            t += 1
            self.sched.check_integrity()  # every page counted once per holder, after every step or run
        return self


def test_the_compact_path_decides_what_the_engine_path_does_through_preemptions():
    engine = Driver().play(Driver.engine_step)
    compact = Driver().play(Driver.compact_step)
    preempted = [p for _, p in engine.plans.values() if p]
    assert preempted, "the pool is meant to be too small: some step must preempt"
    assert set(engine.finished) == {"short", "a", "b", "c"}
    assert compact.plans == engine.plans
    assert compact.finished == engine.finished
    assert compact.sched.index.cached_page_ids() == engine.sched.index.cached_page_ids()


def test_decode_runs_in_one_pass_give_the_steps_one_by_one_give():
    engine = Driver().play(Driver.engine_step)
    runs = Driver().play(Driver.compact_step, use_runs=True)
    assert runs.run_steps > 20, "the decodes between arrivals, finishes and preemptions are meant to run"
    # Every step the run path planned (arrivals, prefills, preemptions, and each run's last step, whose page ids
    # show the run allocated and evicted as step by step) decided the same.
    assert len(runs.plans) + runs.run_steps == STEPS
    assert all(runs.plans[t] == engine.plans[t] for t in runs.plans)
    assert runs.finished == engine.finished
    assert runs.sched.index.cached_page_ids() == engine.sched.index.cached_page_ids()


def test_a_decode_run_ends_with_a_finish_and_before_the_pool_runs_out():
    sched = Scheduler(PrefixIndex(PagePool(1 + 12, PS)), SchedulerConfig(max_step_tokens=256))
    sched.add(Request(RequestId("x"), prompt(20, 5), max_new_tokens=10))
    sched.add(Request(RequestId("w"), prompt(20, 7), max_new_tokens=30))
    plan = sched.schedule(0.0)
    sched.postprocess(plan, {"x": 1, "w": 1}, 1.0)  # each prefilled 20 tokens (2 pages), sampled 1
    run = sched.decode_run()
    # x has 9 tokens left: the run holds them, and x finishes with its last step (w goes on).
    assert run is not None and run.steps == 9 and run.request_ids == ("x", "w")
    assert (run.starts_sum, run.longest_start) == (40, 20)
    plan = sched.commit_decode_run(run, [1.0 + j for j in range(9)], [[2] * 8, [3] * 8])
    assert plan.decode_starts == (28, 28) and plan.sampled_ids == ("x", "w")  # the 9th step, planned
    finished = sched.postprocess_compact(plan, [2, 3], 10.0)
    assert [(f.request_id, f.output, f.finish_reason) for f in finished] == [("x", (1,) + (2,) * 9, "length")]
    assert sched.num_running == 1 and sched.decode_run().steps == 20  # w's 20 tokens left

    sched = Scheduler(PrefixIndex(PagePool(1 + 12, PS)), SchedulerConfig(max_step_tokens=256))
    sched.add(Request(RequestId("x"), prompt(20, 5), max_new_tokens=100))
    sched.add(Request(RequestId("y"), prompt(100, 6), max_new_tokens=50))
    assert sched.decode_run() is None  # both wait, and there are seats: the next step admits them
    plan = sched.schedule(0.0)
    sched.postprocess(plan, {"x": 1, "y": 1}, 1.0)  # x holds 2 pages, y 7: 3 left, none evictable (locked)
    # x needs its 3rd page at position 32 and y its 8th at 112, both in run step 12 (from 0): 1 page is left.
    # In step 28, x at 48 and y at 128 each need one more: the run stops before it, and that step preempts y.
    run = sched.decode_run()
    assert run is not None and run.request_ids == ("x", "y") and run.steps == 28
    assert (run.starts_sum, run.longest_start) == (120, 100)
    plan = sched.commit_decode_run(run, [1.0 + j for j in range(run.steps)], [[1] * (run.steps - 1)] * 2)
    assert sched.postprocess_compact(plan, [1, 1], 29.0) == ()
    assert sched.index.pool.num_free == 1
    plan = sched.schedule(29.0)
    assert plan.preempted == ("y",) and [(s.request_id, s.start) for s in plan.seqs] == [("x", 48)]
