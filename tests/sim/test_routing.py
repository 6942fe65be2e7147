"""Routing a fleet: round-robin and llm-d's precise-prefix picker on tiny fleets worked out by hand."""

import dataclasses
from dataclasses import dataclass

import numpy as np

from kvbench.engines.kvengine.core.scheduler import Request, RequestId
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import (
    ROUTE_PRECISE_PREFIX,
    ROUTE_PREFIX_AFFINITY,
    ROUTE_ROUND_ROBIN,
    Affinity,
    Scorers,
    get_preset,
)
from kvbench.sim.routing import SPECULATIVE_TTL_S, Router, block_hashes, prefix_scores
from kvbench.workloads.shared_prefix import SharedPrefixParams, generate_shared_prefix


@dataclass
class FakeNode:
    """What the picker reads of a node: its cached leading pages of the prompt, KV usage and queue."""

    cached: int
    kv_usage: float
    waiting: int
    load: int = 0

    def cached_pages(self, request) -> int:
        return self.cached


def request(n_tokens: int = 32) -> Request:
    return Request(RequestId("r"), np.arange(1000, 1000 + n_tokens, dtype=np.int32), 4)


def test_precise_prefix_picks_the_best_weighted_score_by_hand():
    # Prompt of 8 pages (page 4). Scores = 3 x prefix + 2 x (1 - usage) + 2 x queue, queue min-max normalized, and
    # prefix min-max normalized over the nodes holding the first page (nodes 0 and 1: 6 pages -> 1, 2 pages -> 0):
    #   node 0: 6/8 cached, 90 % used, 4 waiting -> 3(1) + 2(0.1) + 2(0)   = 3.2
    #   node 1: 2/8 cached, 20 % used, 0 waiting -> 3(0) + 2(0.8) + 2(1)   = 3.6   <- picked
    #   node 2: none,        0 % used, 2 waiting -> 0    + 2(1.0) + 2(0.5) = 3.0
    nodes = [FakeNode(6, 0.9, 4), FakeNode(2, 0.2, 0), FakeNode(0, 0.0, 2)]
    router = Router(nodes, ROUTE_PRECISE_PREFIX, page_size=4)
    assert np.allclose(router.precise_scores(request(), now=0.0), [3.2, 3.6, 3.0])
    assert router.pick(0, request(), now=0.0) == 1
    # The whole prompt now stands speculatively on node 1 (8 pages: prefix 1, 3 + 1.6 + 2 = 6.6; node 0 drops to
    # prefix 0: 0.2) until the TTL ends.
    assert np.allclose(router.precise_scores(request(), now=1.0), [0.2, 6.6, 3.0])
    assert np.allclose(router.precise_scores(request(), now=SPECULATIVE_TTL_S + 0.1), [3.2, 3.6, 3.0])


def test_prefix_score_is_normalized_over_the_holders_not_a_fraction_of_the_prompt():
    # llm-d's scorer min-max normalizes the holders' block counts; a fraction of the prompt's 8 pages would pick
    # the other node in both fleets below.
    #   alone: node 0 holds 2/8 (prefix 1, not 0.25), 90 % used -> 3 + 0.2 + 2 = 5.2   <- picked (fraction: 2.95)
    #          node 1 none, idle                               -> 0 + 2.0 + 2 = 4.0
    alone = Router([FakeNode(2, 0.9, 0), FakeNode(0, 0.0, 0)], ROUTE_PRECISE_PREFIX, page_size=4)
    assert np.allclose(alone.precise_scores(request(), 0.0), [5.2, 4.0])
    assert alone.pick(0, request(), 0.0) == 0
    #   beside a full holder: node 0 8/8, 60 % used, 4 waiting                -> 3(1) + 0.8 + 0 = 3.8   <- picked
    #                         node 1 4/8 (prefix 0, not 0.5), 20 % used, none -> 0 + 1.6 + 2 = 3.6 (fraction: 5.1)
    #                         node 2 none, 50 % used, 2 waiting               -> 0 + 1.0 + 1 = 2.0
    nodes = [FakeNode(8, 0.6, 4), FakeNode(4, 0.2, 0), FakeNode(0, 0.5, 2)]
    beside = Router(nodes, ROUTE_PRECISE_PREFIX, page_size=4)
    assert np.allclose(beside.precise_scores(request(), 0.0), [3.8, 3.6, 2.0])
    assert beside.pick(0, request(), 0.0) == 0
    # Equal holders all score 1; no holder at all: 0 everywhere (load alone decides).
    assert prefix_scores([5, 0, 5]) == [1.0, 0.0, 1.0]
    assert prefix_scores([0, 0]) == [0.0, 0.0]


def test_a_fully_cached_node_wins_over_an_idle_one():
    #   node 0: 8/8 cached, 50 % used, 2 waiting -> 3 + 1.0 + 2(0.5) = 5.0   <- picked
    #   node 1: none,       20 % used, 0 waiting -> 0 + 1.6 + 2      = 3.6
    #   node 2: none,        0 % used, 4 waiting -> 0 + 2.0 + 0      = 2.0
    nodes = [FakeNode(8, 0.5, 2), FakeNode(0, 0.2, 0), FakeNode(0, 0.0, 4)]
    router = Router(nodes, ROUTE_PRECISE_PREFIX, page_size=4)
    assert np.allclose(router.precise_scores(request(), 0.0), [5.0, 3.6, 2.0])
    assert router.pick(0, request(), 0.0) == 0


def test_the_weights_come_from_the_scorers_and_the_cpu_prefix_index_is_what_was_sent():
    # Weights gpu_prefix 1, kv 2, queue 2, cpu_prefix 1, and a CPU-prefix index of 8 blocks (pages) per node.
    #   node 0: 6/8 cached, 90 % used, 4 waiting -> 1(1) + 2(0.1) + 2(0)   = 1.2
    #   node 1: 2/8 cached, 20 % used, 0 waiting -> 1(0) + 2(0.8) + 2(1)   = 3.6   <- picked
    #   node 2: none,        0 % used, 2 waiting -> 0    + 2(1.0) + 2(0.5) = 3.0
    # nothing sent yet: cpu_prefix 0 everywhere.
    nodes = [FakeNode(6, 0.9, 4), FakeNode(2, 0.2, 0), FakeNode(0, 0.0, 2)]
    scorers = Scorers(queue=2, kv_utilization=2, gpu_prefix=1, cpu_prefix=1, cpu_lru_blocks=8)
    router = Router(nodes, ROUTE_PRECISE_PREFIX, page_size=4, scorers=scorers)
    assert np.allclose(router.precise_scores(request(), now=0.0), [1.2, 3.6, 3.0])
    assert router.pick(0, request(), now=0.0) == 1
    # After the TTL the speculative entries are gone, but the router's index still holds the 8 blocks it sent to
    # node 1: cpu_prefix 8/8 there, 3.6 + 1 = 4.6.
    assert np.allclose(router.precise_scores(request(), now=SPECULATIVE_TTL_S + 1), [1.2, 4.6, 3.0])
    # A 16-block prompt (the fake nodes report the same cached pages for it: node 1 is picked again, 3.6) evicts
    # the LRU: the index keeps the newest 8 blocks, not the old prompt's leading ones -> cpu_prefix 0 again.
    other = Request(RequestId("o"), np.arange(5000, 5064, dtype=np.int32), 4)
    assert router.pick(1, other, now=10.0) == 1
    assert len(router.sent_blocks[1]) == 8
    assert np.allclose(router.precise_scores(request(), now=20.0), [1.2, 3.6, 3.0])


def test_prefix_affinity_sticks_to_the_sender_until_the_ttft_gate_breaks_it():
    # Prompt of 8 pages (page 4). Threshold 0.75, 1,000 prompt tokens/s, 0.5 s of TTFT penalty allowed.
    affinity = Affinity(threshold=0.75, max_ttft_penalty_s=0.5, peak_prefill_tok_s=1000.0, lru_blocks=64)
    nodes = [FakeNode(0, 0.0, 0) for _ in range(3)]
    router = Router(nodes, ROUTE_PREFIX_AFFINITY, page_size=4, affinity=affinity)
    # Nothing sent: no node is sticky, and all carry 0 tokens: the seeded tie-break picks one.
    first = router.pick(0, request(), now=0.0)
    assert router.inflight_tokens[first] == 32
    # The router sent all 8 blocks there (8/8 >= 0.75): sticky, and its TTFT estimate 32/1000 s is within 0.5 s
    # of an idle node's 0 s, so the prompt goes back there even though it carries the most tokens.
    assert router.affinity_candidates(block_hashes(request().prompt, 4)) == [first]
    assert router.pick(1, request(), now=0.0) == first
    # 600 more prompt tokens in flight there (664 in all: 0.664 s, over 0.5 s more than an idle node): the gate
    # breaks stickiness and the token load picks the least loaded node.
    router.inflight_tokens[first] += 600
    assert len(router.affinity_candidates(block_hashes(request().prompt, 4))) == 3
    assert router.pick(2, request(), now=0.0) != first
    # A request finishing gives its tokens back.
    router.finished(first, 32)
    assert router.inflight_tokens[first] == 632


def test_prefix_affinity_needs_the_threshold_of_the_prompt_sent_before():
    # The router sent 4 of a prompt's 8 leading blocks to node 1 (a 4-page prompt that is their prefix), which
    # carries 100 prompt tokens; node 0 is idle.
    def router(threshold: float) -> Router:
        affinity = Affinity(threshold=threshold, max_ttft_penalty_s=5.0, peak_prefill_tok_s=1000.0, lru_blocks=64)
        nodes = [FakeNode(0, 0.0, 0) for _ in range(2)]
        r = Router(nodes, ROUTE_PREFIX_AFFINITY, page_size=4, affinity=affinity)
        r.inflight_tokens = [0, 100]
        r._record_sent(1, block_hashes(request().prompt[:16], 4), 64)
        return r

    # 4/8 is under a 0.75 threshold: no node is sticky, and the least token load decides (node 0).
    assert router(0.75).affinity_candidates(block_hashes(request().prompt, 4)) == [0, 1]
    assert router(0.75).pick(0, request(), now=0.0) == 0
    # At threshold 0.5 the half is enough: node 1 is the only candidate despite its load.
    assert router(0.5).affinity_candidates(block_hashes(request().prompt, 4)) == [1]
    assert router(0.5).pick(0, request(), now=0.0) == 1


def test_simultaneous_arrivals_on_idle_replicas_spread_by_the_seeded_tie_break():
    # 45 distinct prompts at the same instant on 8 idle replicas: every score ties (nothing cached, no queue yet,
    # no KV used), so llm-d's max-score picker draws among all 8. The lowest index would take all 45.
    def picks(seed: int) -> list[int]:
        nodes = [FakeNode(0, 0.0, 0) for _ in range(8)]
        router = Router(nodes, ROUTE_PRECISE_PREFIX, page_size=4, rng=np.random.default_rng(seed))
        return [
            router.pick(k, Request(RequestId(f"r{k}"), np.arange(k * 100, k * 100 + 32, dtype=np.int32), 4), 0.0)
            for k in range(45)
        ]

    first = picks(7)
    assert len(set(first)) >= 6 and max(first.count(n) for n in range(8)) <= 15
    assert picks(7) == first  # the same seed, the same choices
    assert picks(8) != first


def test_a_whole_simulation_at_concurrency_45_spreads_its_first_requests():
    workload = shared(45, 1, 45)  # 45 different system prompts, all sent at t=0 (closed loop of 45)
    config = fleet(ROUTE_PRECISE_PREFIX, nodes=8)
    runs = [simulate(workload, LoadSpec(concurrency=45), config, seed=seed) for seed in (3, 3)]
    nodes = [runs[0].node_of[r.request_id] for r in runs[0].records]
    assert len(set(nodes)) >= 6
    assert runs[0].node_of == runs[1].node_of


def fleet(route: str, nodes: int = 3) -> SimConfig:
    preset = dataclasses.replace(get_preset("vllm-prefix"), num_nodes=nodes, route=route, page_size=4)
    return SimConfig(load_geometry("tiny-random"), load_hardware("cpu"), preset, "fp16", device_kv_tokens=4096)


def shared(groups: int, per_group: int, requests: int):
    return generate_shared_prefix(SharedPrefixParams(groups, per_group, 32, 8, 3, requests, vocab_size=512), seed=2)


def test_round_robin_sends_request_k_to_node_k_mod_n():
    workload = shared(2, 3, 12)
    result = simulate(workload, LoadSpec(rate=5.0), fleet(ROUTE_ROUND_ROBIN))
    order = sorted(result.records, key=lambda r: r.sent_ns)
    assert [result.node_of[r.request_id] for r in order] == [k % 3 for k in range(12)]


def test_precise_prefix_keeps_each_group_on_one_node_and_reuses_it():
    workload = shared(3, 4, 24)  # 3 system prompts, each sent 8 times, slowly enough to find them cached
    result = simulate(workload, LoadSpec(rate=1.0), fleet(ROUTE_PRECISE_PREFIX))
    by_group: dict[bytes, set[int]] = {}
    for session, record in zip(workload.sessions, sorted(result.records, key=lambda r: int(r.session_id[3:]))):
        by_group.setdefault(session.context.tobytes(), set()).add(result.node_of[record.request_id])
    assert all(len(nodes) == 1 for nodes in by_group.values())
    rr = simulate(workload, LoadSpec(rate=1.0), fleet(ROUTE_ROUND_ROBIN))
    cached = sum(r.cached_tokens for r in result.records)
    assert cached > sum(r.cached_tokens for r in rr.records)
