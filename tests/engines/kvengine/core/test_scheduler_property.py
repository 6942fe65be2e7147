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
        arrivals.setdefault(step, []).append(
            Request(RequestId(f"r{k}"), tokens, max_new_tokens=out, tenant=tenant, shared_tokens=len(shared))
        )
    config = SchedulerConfig(
        max_num_seqs=draw(st.integers(2, 4)),
        max_step_tokens=draw(st.integers(4, 64)),
        allow_swap=draw(st.booleans()),
        strict_isolation=draw(st.booleans()),
        max_prefill_beside_decodes=draw(st.none() | st.integers(1, 8)),
    )
    return num_pages, ps, arrivals, config


def check(num_pages, ps, arrivals, config) -> None:
    drives = {path: Drive(num_pages, ps, arrivals, path, config).play() for path in (ENGINE, COMPACT, RUNS)}
    expected = {
        r.request_id: tuple(token(r.request_id, k) for k in range(r.max_new_tokens))
        for rs in arrivals.values()
        for r in rs
    }
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


def check_budget(num_pages, ps, arrivals, config) -> int:
    """On the engine's path, step by step: a sequence that sampled a token (and has room for more) decodes it
    in the very next step unless that step preempts it, and a step that decodes (a sampled sequence's last
    token) computes at most
    `max_prefill_beside_decodes` prefill tokens beside its decodes. Returns how many steps ran prefill
    beside decodes (to show the rule was exercised)."""
    drive = Drive(num_pages, ps, arrivals, ENGINE, config).play()
    requests = {r.request_id: r for rs in arrivals.values() for r in rs}
    produced = dict.fromkeys(requests, 0)
    preempted: dict[int, set] = {}
    for t, rid in drive.preempted:
        preempted.setdefault(t, set()).add(rid)
    decoding: set = set()  # sampled last step, not finished: each must decode in this one
    mixed = 0
    for t in sorted(drive.plans):
        length = {rid: len(r.prompt) + produced[rid] for rid, r in requests.items()}
        plan = drive.plans[t]
        # a decode: the last token of a request that has sampled (recomputed after a preemption, or not)
        decodes = {
            rid for rid, start, end, _ in plan if produced[rid] and (start, end) == (length[rid] - 1, length[rid])
        }
        prefill = sum(end - start for rid, start, end, _ in plan if rid not in decodes)
        if len(decoding) <= config.max_step_tokens:  # room for every decode: none may wait
            assert decoding - decodes <= preempted.get(t, set()), (t, decoding, plan)
        if decodes & decoding:  # running decodes (not only a re-admitted sequence's recomputed last token)
            mixed += prefill > 0
            limit = config.max_prefill_beside_decodes or config.max_step_tokens
            assert prefill <= min(limit, config.max_step_tokens - len(decodes)), (t, plan)
        decoding -= preempted.get(t, set())
        for rid, start, end, _ in plan:
            if end == length[rid]:  # it sampled
                produced[rid] += 1
                (decoding.add if produced[rid] < requests[rid].max_new_tokens else decoding.discard)(rid)
    return mixed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_decodes_go_first_and_prefill_beside_them_stays_within_its_budget(workload):
    check_budget(*workload)


def test_a_prompt_beside_a_decode_is_prefilled_in_chunks_of_the_budget():
    """The property's rule binds: a request arriving while another decodes is prefilled in chunks of the
    budget beside it, where without the budget its whole prompt runs in one step beside the decode."""
    arrivals = {
        0: [Request(RequestId("a"), prompt(6, 1), max_new_tokens=12)],
        2: [Request(RequestId("b"), prompt(30, 2), max_new_tokens=2)],
    }
    budgeted = SchedulerConfig(max_step_tokens=64, max_prefill_beside_decodes=4)
    assert check_budget(20, 4, arrivals, budgeted) == 8  # b's 30 tokens: 7 chunks of 4, then 2, beside a
    unlimited = SchedulerConfig(max_step_tokens=64)
    assert check_budget(20, 4, arrivals, unlimited) == 1  # all 30 in one step beside a's decode
