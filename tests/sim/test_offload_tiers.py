"""Each connector's tier policy on hand-worked examples: a store as a step computes, an eviction, a restore at a
given bandwidth, overlapped with the other requests' steps (vLLM) or inside the step (LMCache).

The model is qwen2.5-72b with fp8 KV: 2 (K, V) x 80 layers x 8 KV heads x 128 dims x 1 byte = 163,840 bytes
a token, on 8 devices; the cpu tier's speed is given as 10 GB/s per device (80 GB/s for the node) without
latency, so 1,024 tokens (167,772,160 bytes) cross in 2.097152 ms.
"""

import dataclasses

import numpy as np
import pytest

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.scheduler import Request, RequestId
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.engine import SimConfig
from kvbench.sim.fleet import build_nodes
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.kv_offload import parse_kv_offload
from kvbench.sim.node import SimNode
from kvbench.sim.offload_policy import LinkQueue, loadable_pages, stored_upto
from kvbench.sim.presets import get_preset

KV_BYTES = 2 * 80 * 8 * 128  # a token's fp8 KV
NODE_BW = 8 * 10e9  # 10 GB/s per device, 8 devices
PS = 16  # tokens a page


def test_a_step_stores_whole_blocks_only():
    assert stored_upto(computed_pages=5, stored_pages=0, block_pages=1) == 5
    assert stored_upto(computed_pages=5, stored_pages=0, block_pages=4) == 4  # the 5th page waits for its block
    assert stored_upto(computed_pages=7, stored_pages=4, block_pages=4) == 4  # nothing new is whole yet
    assert stored_upto(computed_pages=8, stored_pages=4, block_pages=4) == 8


def test_a_load_brings_whole_blocks_past_the_device_hit():
    assert loadable_pages(device_pages=2, tier_pages=10, block_pages=1) == 8
    # Blocks of 4 pages: the tier's 10 pages are 2 whole blocks (8 pages); the device holds 2 of them.
    assert loadable_pages(device_pages=2, tier_pages=10, block_pages=4) == 6
    # vLLM loads nothing short of a block (get_num_new_matched_tokens); LMCache takes what it has.
    assert loadable_pages(device_pages=6, tier_pages=8, block_pages=4) == 0
    assert loadable_pages(device_pages=6, tier_pages=8, block_pages=4, min_block=False) == 2
    assert loadable_pages(device_pages=9, tier_pages=8, block_pages=4) == 0


def test_a_link_carries_one_transfer_at_a_time():
    link = LinkQueue()
    assert (link.send(0.0, 2.0).done, link.send(1.0, 2.0).done, link.send(10.0, 1.0).done) == (2.0, 4.0, 11.0)
    assert link.busy_s == 5.0


def config_with(spec, device_kv_tokens: int = 20_000) -> SimConfig:
    """The tier tests' system: Qwen2.5-72B on 8x H200, fp8 KV, `device_kv_tokens` of device KV, `spec`'s tiers."""
    return SimConfig(
        load_geometry("qwen2.5-72b"),
        load_hardware("8xh200"),
        get_preset("vllm-prefix"),
        "fp8",
        "fp8",
        device_kv_tokens,
        kv_offload=spec,
    )


def node(connector: str, cpu_bytes: float = 1e12, device_kv_tokens: int = 20_000) -> SimNode:
    spec = parse_kv_offload(
        {
            "medium": "cpu",
            "connector": connector,
            "bytes_per_replica": cpu_bytes,
            "read_gb_s": 10,
            "write_gb_s": 10,
            "latency_ms": 0,
        }
    )
    config = config_with(spec, device_kv_tokens)
    assert config.cost.kv_bytes_per_token == KV_BYTES
    [n] = build_nodes(config)
    return n


def request(rid: str, prompt: np.ndarray, max_tokens: int = 4) -> Request:
    return Request(RequestId(rid), prompt, max_tokens, tenant=TenantId("t"))


def run_until_idle(n: SimNode, now: float, answers: dict) -> tuple[float, list]:
    """Step `n` to the end, as the simulator's loop would (no other events); the (begin, seconds, plan) of
    every step."""
    steps = []
    while n.has_work():
        started = n.begin_step(now)
        if started is None:
            now = n.wake_at
            continue
        plan, seconds = started
        steps.append((now, seconds, plan))
        now += seconds
        n.end_step(plan, now)
    return now, steps


def tokens(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.int32)


def test_vllm_stores_each_step_s_computed_blocks_and_they_are_visible_once_copied():
    n = node("vllm-native")
    tiers = n.below
    prompt = tokens(1, 1_030)  # 64 full pages and 6 tokens
    r = request("a", prompt, max_tokens=1)
    n.admit(r, np.array([7]), n.plan_restore(r, 0.0), 0.0)
    plan, seconds = n.begin_step(0.0)
    n.end_step(plan, seconds)
    # The prefill's 64 full pages (1,024 tokens) were sent device -> host when the step ended.
    copy_s = 1_024 * KV_BYTES / NODE_BW
    assert tiers.to_host_queue.free_at == pytest.approx(seconds + copy_s)
    assert tiers.stored_tokens == {"host": 1_024}
    ns = n._namespace(r)
    [lane] = tiers.lanes
    assert lane.tier.match_pages(ns, prompt) == 0  # still in flight: nothing visible yet
    probe = request("b", np.concatenate([prompt[:1_024], tokens(5_000, 40)]))
    assert tiers.lookup(n.scheduler.index, ns, probe.prompt, 66, seconds + copy_s / 2) is None
    assert lane.tier.match_pages(ns, prompt) == 0
    tiers.lookup(n.scheduler.index, ns, probe.prompt, 66, seconds + copy_s)
    assert lane.tier.match_pages(ns, prompt) == 64


def test_the_cpu_tier_evicts_its_least_recently_used_blocks():
    n = node("vllm-native", cpu_bytes=3 * PS * KV_BYTES)  # room for 3 pages
    [lane] = n.below.lanes
    a, b = tokens(1, 2 * PS), tokens(1_000, 2 * PS)
    ns = n._namespace(request("x", a))
    lane.tier.store(ns, a, TenantId("t"), 1.0)
    lane.tier.store(ns, b, TenantId("t"), 2.0)  # needs 2 pages, has 1: a's last page goes (LRU leaf)
    assert (lane.tier.match_pages(ns, a), lane.tier.match_pages(ns, b)) == (1, 2)


def cpu_hit_scenario(connector: str):
    """Request A decodes a long answer from t=0; at t=0.05 request B arrives whose first 1,024 tokens the cpu
    tier holds (and the device does not)."""
    n = node(connector)
    a = request("a", tokens(1, 100), max_tokens=60)
    n.admit(a, tokens(9_000, 60), n.plan_restore(a, 0.0), 0.0)
    prefix = tokens(50_000, 1_024)
    b = request("b", np.concatenate([prefix, tokens(60_000, 40)]), max_tokens=2)
    n.below.lanes[0].tier.store(n._namespace(b), prefix, TenantId("t"), 0.0)
    now, steps = 0.0, []
    while now < 0.05:
        plan, seconds = n.begin_step(now)
        steps.append((now, seconds, plan))
        now += seconds
        n.end_step(plan, now)
    arrival = now
    n.admit(b, tokens(70_000, 2), n.plan_restore(b, arrival), arrival)
    _, more = run_until_idle(n, arrival, {})
    return n, steps + more, arrival


def test_vllm_loads_a_cpu_hit_while_the_other_requests_steps_run():
    n, steps, arrival = cpu_hit_scenario("vllm-native")
    load_s = 1_024 * KV_BYTES / NODE_BW  # 2.097152 ms
    b_steps = [(begin, plan) for begin, _, plan in steps if any(e.request_id == "b" for e in plan.others)]
    first_b = b_steps[0][0]
    # B is scheduled at the first step boundary after its load is done, not before ...
    assert first_b >= arrival + load_s
    before = [begin + s for begin, s, _ in steps if begin < first_b]
    assert first_b == max(before)
    # ... and the steps meanwhile decode A alone, as long as A's decode steps take without B.
    meanwhile = [s for begin, s, plan in steps if arrival <= begin < first_b]
    assert meanwhile and all(len(plan.others) == 0 for begin, _, plan in steps if arrival <= begin < first_b)
    assert n.stats.load_wait_s == 0.0
    # B computed only what the tier lacked: 1,024 tokens restored, 40 computed in its prefill.
    [(_, plan)] = b_steps[:1]
    [chunk] = [e for e in plan.others if e.request_id == "b"]
    assert (chunk.start, chunk.end) == (1_024, 1_064)
    assert n.restored["b"] == {"host": 1_024} and n.stats.tier_hits == {"host": 1}
    assert n.stats.restore_s == pytest.approx(load_s)


def test_lmcache_retrieves_a_cpu_hit_inside_the_step_that_admits_it():
    n, steps, arrival = cpu_hit_scenario("lmcache")
    load_s = 1_024 * KV_BYTES / NODE_BW
    [(begin, seconds, plan)] = [s for s in steps if any(e.request_id == "b" for e in s[2].others)][:1]
    # B joins the first step after it arrives, and that step lasts its compute plus the retrieve.
    assert begin == min(b for b, _, _ in steps if b >= arrival)
    compute = n.cost.step(plan.others, plan.decode_starts).seconds
    assert seconds == pytest.approx(compute + load_s)
    assert n.stats.load_wait_s == pytest.approx(load_s)
    # LMCache's chunks are 256 tokens: the 1,024 held are 4 whole chunks.
    [chunk] = [e for e in plan.others if e.request_id == "b"]
    assert (chunk.start, chunk.end) == (1_024, 1_064)


def peer_nodes(min_pull_tokens: int) -> list[SimNode]:
    spec = parse_kv_offload(
        {
            "medium": "peer",
            "connector": "vllm-native",
            "read_gb_s": 25,
            "latency_ms": 0,
            "min_pull_tokens": min_pull_tokens,
        }
    )
    preset = dataclasses.replace(get_preset("vllm-prefix"), num_nodes=2)
    config = SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), preset, "fp8", "fp8", 20_000, kv_offload=spec
    )
    return build_nodes(config)


@pytest.mark.parametrize("min_pull_tokens, pulled", [(2_048, 2_048), (2_049, 0)])
def test_a_replica_pulls_a_peer_s_longer_prefix_over_the_network(min_pull_tokens, pulled):
    """Node 1 computed a 2,048-token prefix; a request for it on node 0 pulls it from node 1 when that is at
    least `min_pull_tokens` (llm-d's minCachedTokenDelta), at 25 GB/s straight into device memory."""
    n0, n1 = peer_nodes(min_pull_tokens)
    prefix = tokens(1, 2_048)
    first = request("a", np.concatenate([prefix, tokens(90_000, 8)]), max_tokens=1)
    n1.admit(first, np.array([5]), n1.plan_restore(first, 0.0), 0.0)
    end, _ = run_until_idle(n1, 0.0, {})
    b = request("b", np.concatenate([prefix, tokens(80_000, 8)]), max_tokens=1)
    n0.admit(b, np.array([5]), n0.plan_restore(b, end), end)
    _, steps = run_until_idle(n0, end, {})
    [chunk] = steps[0][2].others
    assert chunk.start == pulled
    assert n0.restored.get("b", {}) == ({"peer": 2_048} if pulled else {})
    if pulled:
        assert n0.stats.restore_s == pytest.approx(2_048 * KV_BYTES / 25e9)
        assert steps[0][0] == pytest.approx(end + 2_048 * KV_BYTES / 25e9)


def test_a_preempted_request_loads_its_offloaded_blocks_instead_of_recomputing():
    """Two requests of 500-token prompts decode 700 tokens each on a device of 1,400 tokens: the later one is
    preempted when the pages run out. With vLLM's cpu tier its blocks were stored as they were computed, so
    when it is fed again the tier is looked up for it (prompt and output so far) as for a new request."""
    from kvbench.measure.schedule import LoadSpec
    from kvbench.sim.engine import simulate
    from kvbench.workloads.profiles import workload_from_mapping

    work = workload_from_mapping(
        {
            "generator": "shared_prefix",
            "num_groups": 2,
            "num_prompts_per_group": 1,
            "system_prompt_len": 480,
            "question_len": 20,
            "output_len": 700,
        },
        "p",
        num_sessions=2,
    )
    spec = parse_kv_offload({"medium": "cpu", "connector": "vllm-native", "bytes_per_replica": 1e12})
    base = SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset("vllm-prefix"), "fp8", "fp8", 1_400
    )
    device_only = simulate(work, LoadSpec(rate=1000.0), base)
    offload = simulate(work, LoadSpec(rate=1000.0), dataclasses.replace(base, kv_offload=spec))
    for result in (device_only, offload):
        assert all(r.ok and r.output_tokens == 700 == len(r.chunks) for r in result.records)
        assert result.nodes[0]["preempted"] > 0
    assert device_only.nodes[0]["restored_tokens"] == {}
    # When it is fed again (once the pool can hold it), the device has lost part of it: the tier brings that
    # back, and the node computes less than it recomputes without the tier.
    assert offload.nodes[0]["restored_tokens"]["host"] > 0
    assert offload.nodes[0]["busy_s"] < device_only.nodes[0]["busy_s"]
    # The hit at first admission is what the record reports, not the requeued request's.
    assert [r.cached_tokens for r in offload.records] == [r.cached_tokens for r in device_only.records]


def test_lmcache_restores_from_a_storage_tier_at_its_bandwidth_and_latency():
    """LMCache with a 4-page cpu tier and a Lustre-like disk tier (2 GB/s, 1 ms a transfer): a 1,024-token
    prefix written through to both is evicted from cpu by a later one and read back from disk, through the
    host: disk at 2 GB/s is the slow stage, the host link (80 GB/s) adds one 256-token chunk's fill."""
    spec = parse_kv_offload(
        [
            {
                "medium": "cpu",
                "connector": "lmcache",
                "bytes_per_replica": 4 * PS * KV_BYTES,
                "read_gb_s": 10,
                "latency_ms": 0,
            },
            {
                "medium": "disk",
                "connector": "lmcache",
                "bytes_per_replica": 1e12,
                "read_gb_s": 2,
                "write_gb_s": 2,
                "latency_ms": 1,
            },
        ]
    )
    config = config_with(spec)
    [n] = build_nodes(config)
    cpu, disk = n.below.lanes
    prefix, other = tokens(1, 1_024), tokens(20_000, 4 * PS)
    ns = n._namespace(request("x", prefix))
    for lane in (cpu, disk):
        lane.tier.store(ns, prefix, TenantId("t"), 0.0)
    cpu.tier.store(ns, other, TenantId("t"), 1.0)  # the cpu tier's 4 pages now hold `other`
    b = request("b", np.concatenate([prefix, tokens(60_000, 40)]), max_tokens=1)
    lookup = n.below.lookup(n.scheduler.index, ns, b.prompt, 66, 2.0)
    assert lookup.tokens_by_tier == {Tier.DISK: 1_024}
    seconds = config.cost.restore_seconds(lookup.tokens_by_tier)
    disk_s, chunk_on_host = 1_024 * KV_BYTES / 2e9, 256 * KV_BYTES / NODE_BW
    assert seconds == pytest.approx(disk_s + chunk_on_host + 1e-3)


def test_a_tier_aware_router_sees_a_node_s_cpu_prefix_once_its_copy_is_done():
    n = node("vllm-native")
    prompt = tokens(1, 1_030)
    r = request("a", prompt, max_tokens=1)
    n.admit(r, np.array([7]), n.plan_restore(r, 0.0), 0.0)
    plan, seconds = n.begin_step(0.0)
    n.end_step(plan, seconds)
    copied = n.below.to_host_queue.free_at
    probe = request("b", prompt)
    assert n.offloaded_pages(probe, (seconds + copied) / 2) == 0
    assert n.offloaded_pages(probe, copied) == 64
