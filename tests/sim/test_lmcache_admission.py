"""LMCache's admission path in a simulated node: a cpu/disk hit is retrieved in the forward pass of the step
that schedules the request (vLLM's LMCacheConnectorV1 loads in `start_load_kv` of that step), looked up at the
queue's head, its restored prefix never computed again, its retrieve paid once; a disk hit written back to the
cpu tier. Hand-worked on the nodes of test_offload_tiers.py."""

import numpy as np
import pytest

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.fleet import build_nodes
from kvbench.sim.kv_offload import parse_kv_offload
from tests.sim.test_offload_tiers import KV_BYTES, NODE_BW, config_with, node, request, tokens


def test_lmcache_pays_a_retrieve_in_the_step_that_schedules_the_request_and_keeps_its_pages_until_then():
    """A's 20,000-token prompt takes several steps' budgets; B, queued behind it, has 1,024 tokens in the cpu
    tier. B is looked up once it is at the queue's head (LMCache retrieves in the step that schedules it), its
    restored pages are its own until it is scheduled (every other cached page is evicted after each step here),
    and only the step that schedules it lasts the retrieve longer."""
    n = node("lmcache", device_kv_tokens=40_000)
    a = request("a", tokens(1, 20_000), max_tokens=2)
    prefix = tokens(50_000, 1_024)
    b = request("b", np.concatenate([prefix, tokens(60_000, 40)]), max_tokens=2)
    n.below.lanes[0].tier.store(n._namespace(b), prefix, TenantId("t"), 0.0)
    n.admit(a, tokens(9_000, 2), n.plan_restore(a, 0.0), 0.0)
    n.admit(b, tokens(70_000, 2), n.plan_restore(b, 0.0), 0.0)
    index, now, steps = n.scheduler.index, 0.0, []
    while n.has_work():
        plan, seconds = n.begin_step(now)
        index.evict(index.evictable_pages, now)  # the most pressure there can be on cached pages
        steps.append((seconds, plan))
        now += seconds
        n.end_step(plan, now)
    load_s = 1_024 * KV_BYTES / NODE_BW
    first_b = next(i for i, (_, plan) in enumerate(steps) if any(e.request_id == "b" for e in plan.others))
    assert first_b > 0  # A's first chunk filled the first step's budget
    for i, (seconds, plan) in enumerate(steps):
        compute = n.cost.step(plan.others, plan.decode_starts).seconds
        assert seconds == pytest.approx(compute + (load_s if i == first_b else 0.0))
    [chunk] = [e for e in steps[first_b][1].others if e.request_id == "b"]
    assert (chunk.start, chunk.end) == (1_024, 1_064)
    assert n.stats.load_wait_s == pytest.approx(load_s)


def test_lmcache_keeps_a_disk_hit_in_its_cpu_tier():
    """LMCache reads a disk hit into host memory and keeps it in its cpu backend: the next lookup of the same
    prefix (on a device that lost it) is a cpu hit."""
    spec = parse_kv_offload(
        [
            {"medium": "cpu", "connector": "lmcache", "bytes_per_replica": 1e12, "read_gb_s": 10, "latency_ms": 0},
            {"medium": "disk", "connector": "lmcache", "bytes_per_replica": 1e12, "read_gb_s": 2, "latency_ms": 1},
        ]
    )
    config = config_with(spec)
    [n] = build_nodes(config)
    cpu, disk = n.below.lanes
    prefix = tokens(1, 1_024)
    b = request("b", np.concatenate([prefix, tokens(60_000, 40)]), max_tokens=1)
    ns = n._namespace(b)
    disk.tier.store(ns, prefix, TenantId("t"), 0.0)
    assert cpu.tier.match_pages(ns, prefix) == 0
    first = n.below.lookup(n.scheduler.index, ns, b.prompt, 66, 1.0)
    assert first.tokens_by_tier == {Tier.DISK: 1_024}
    assert cpu.tier.match_pages(ns, prefix) == 64
    again = n.below.lookup(n.scheduler.index, ns, b.prompt, 66, 2.0)
    assert again.tokens_by_tier == {Tier.HOST: 1_024}


def test_lmcache_schedules_a_hit_in_the_step_after_the_prefill_ahead_of_it_even_between_decode_runs():
    """A decodes 300 tokens; P's 20,000-token prompt takes three steps' budgets; B, behind P, has 1,024 tokens
    in the cpu tier. B waits while P prefills (LMCache retrieves in the step that schedules it), and is
    scheduled by the step right after P's last chunk, driven as the simulator drives a node (pure decode runs
    in one pass): before, the wait for P's prefill held B back for the whole decode run, until A or P
    finished (300 steps), so a node served one such request at a time. B's restored prefix is not computed
    again and its retrieve is paid once, by that step."""
    n = node("lmcache", device_kv_tokens=40_000)
    a = request("a", tokens(1, 100), max_tokens=300)
    p = request("p", tokens(100_000, 20_000), max_tokens=300)
    prefix = tokens(50_000, 1_024)
    b = request("b", np.concatenate([prefix, tokens(60_000, 40)]), max_tokens=2)
    n.below.lanes[0].tier.store(n._namespace(b), prefix, TenantId("t"), 0.0)
    for r, answer in ((a, tokens(9_000, 300)), (p, tokens(8_000, 300)), (b, tokens(70_000, 2))):
        n.admit(r, answer, n.plan_restore(r, 0.0), 0.0)
    now, plans = 0.0, []
    while n.has_work():
        run = n.fast_forward(now, float("inf"))
        if run is None:
            plan, seconds = n.begin_step(now)
        else:
            plan, now, seconds = run.plan, run.begin, run.seconds
            plans += [None] * len(run.ends)  # the run's pure decode steps
        plans.append((seconds, plan))
        now += seconds
        n.end_step(plan, now)

    def index_of(rid: str, last: bool = False) -> int:
        found = [i for i, s in enumerate(plans) if s and any(e.request_id == rid for e in s[1].others)]
        return found[-1] if last else found[0]

    p_last, first_b = index_of("p", last=True), index_of("b")
    assert p_last == 2  # P's 20,000 tokens in three 8,192-token budgets (A's decode takes one token of each)
    assert first_b == p_last + 1
    [chunk] = [e for e in plans[first_b][1].others if e.request_id == "b"]
    assert (chunk.start, chunk.end) == (1_024, 1_064)
    assert [e.end - e.start for s in plans if s for e in s[1].others if e.request_id == "b"] == [40]
    load_s = 1_024 * KV_BYTES / NODE_BW
    seconds, plan = plans[first_b]
    assert seconds == pytest.approx(n.cost.step(plan.others, plan.decode_starts).seconds + load_s)
    assert n.stats.load_wait_s == pytest.approx(load_s) == n.stats.restore_s
    assert n.restored["b"] == {"host": 1_024} and n.stats.tier_hits == {"host": 1}
