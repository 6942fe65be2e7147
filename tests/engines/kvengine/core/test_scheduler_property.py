"""Property: under any mix of pool sizes, prompt lengths, shared prefixes, output lengths, tenants, isolation
modes, recompute or swap, and the preemptions they cause, every page's reference count is its holders after
every step (`Scheduler.check_integrity`), on the engine's path, the compact path and with decode runs; every
request finishes with the tokens it was given; and the three paths decide the same steps. On the core before
its fix it found both crashes of issue 27 within a few hundred examples; the smallest cases are kept, narrated,
in test_preemption_regressions.py."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.engines.kvengine.core.scheduler import Request, RequestId, SchedulerConfig
from tests.engines.kvengine.core.scheduler_drive import COMPACT, ENGINE, RUNS, Drive, prompt, token


@st.composite
def workloads(draw):
    """A few requests on a pool too small for all of them at once, arriving within a few steps (so that
    they run together and preempt one another), with two shared prefixes of up to three pages (declared
    shareable: outside strict isolation they are cached in the shared namespace)."""
    ps = draw(st.sampled_from([2, 4]))
    num_pages = draw(st.integers(4, 10))
    capacity_tokens = (num_pages - 1) * ps
    prefixes = [prompt(draw(st.integers(0, 3 * ps)), 100 + g) for g in range(2)]
    arrivals: dict[int, list[Request]] = {}
    for k in range(draw(st.integers(2, 4))):
        shared = prefixes[draw(st.integers(0, 1))]
        own = prompt(draw(st.integers(1, 2 * ps)), k)
        tokens = np.concatenate([shared, own])[: capacity_tokens - 1]
        out = draw(st.integers(1, max(1, min(4 * ps, capacity_tokens - len(tokens)))))
        step = draw(st.integers(0, 3))
        tenant = draw(st.sampled_from(["a", "b"]))
        arrivals.setdefault(step, []).append(Request(RequestId(f"r{k}"), tokens, max_new_tokens=out, tenant=tenant,
                                                     shared_tokens=len(shared)))
    config = SchedulerConfig(max_num_seqs=draw(st.integers(2, 4)), max_step_tokens=draw(st.integers(4, 64)),
                             allow_swap=draw(st.booleans()), strict_isolation=draw(st.booleans()))
    return num_pages, ps, arrivals, config


def check(num_pages, ps, arrivals, config) -> None:
    drives = {path: Drive(num_pages, ps, arrivals, path, config).play() for path in (ENGINE, COMPACT, RUNS)}
    expected = {r.request_id: tuple(token(r.request_id, k) for k in range(r.max_new_tokens))
                for rs in arrivals.values() for r in rs}
    for path, drive in drives.items():
        assert drive.finished == expected, path
        assert not drive.sched.has_work()
    engine = drives[ENGINE]
    assert drives[COMPACT].plans == engine.plans
    assert drives[COMPACT].preempted == engine.preempted
    runs = drives[RUNS]
    assert all(runs.plans[t] == engine.plans[t] for t in runs.plans)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_step_keeps_each_page_counted_once_per_holder(workload):
    check(*workload)
