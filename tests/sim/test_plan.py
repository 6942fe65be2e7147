"""`kvbench plan`: the node search on a workload whose answer follows from the cost model by hand, the SLO
parser, and routing that keeps a session on its node where the policy says so."""

import json

import pytest

from kvbench.cli.main import main
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.cost import SeqWork
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.plan import PlanPoint, parse_slo, search_nodes
from kvbench.sim.presets import ROUTE_ROUND_ROBIN, get_preset
from kvbench.workloads.profiles import load_workload

PROMPT = 8192  # = the preset's max_step_tokens: one prefill fills a step, so a node serves requests one by one
REQUESTS = 8


def one_prefill_seconds() -> float:
    """The cost model's stated time of one request: a single step computing its 8192-token prompt (it asks for
    one output token, sampled at the end of that step)."""
    config = SimConfig(load_geometry("tiny-random"), load_hardware("cpu"), get_preset("vllm-prefix"), "fp16")
    return config.cost.step([SeqWork(0, PROMPT)]).seconds


def write_trace(path, gap_ms: int) -> None:
    """Mooncake rows: REQUESTS distinct 8192-token prompts (no shared block), one every `gap_ms`."""
    blocks = PROMPT // 512
    with open(path, "w") as out:
        for k in range(REQUESTS):
            ids = list(range(k * blocks, (k + 1) * blocks))
            out.write(
                json.dumps({"timestamp": k * gap_ms, "input_length": PROMPT, "output_length": 1, "hash_ids": ids})
                + "\n"
            )


def worst_ttft_s(nodes: int, service_s: float, gap_s: float) -> float:
    """By hand: request k goes to node k mod n (one session per request, sticky-session routing), so a node
    receives one request every n * gap and serves each in `service_s`, one at a time. Its j-th request
    (j = 0, 1, ...) then waits j * (service - n * gap) when the node cannot keep up, so its TTFT is
    service + j * max(0, service - n * gap); the worst is the node with the most requests, at its last one."""
    most = -(-REQUESTS // nodes)
    return service_s + (most - 1) * max(0.0, service_s - nodes * gap_s)


def test_plan_finds_the_node_count_worked_out_from_the_cost_model(tmp_path):
    service = one_prefill_seconds()
    gap_ms = round(0.75 * service * 1000)  # arrivals faster than one node serves, slower than two
    gap = gap_ms / 1000
    limit_ms = 1.5 * service * 1000
    expected = next(n for n in range(1, 9) if worst_ttft_s(n, service, gap) * 1000 <= limit_ms)
    assert expected == 2 and worst_ttft_s(1, service, gap) * 1000 > limit_ms  # one node overloaded, two enough
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, gap_ms)
    out = tmp_path / "plan"
    assert (
        main(
            [
                "plan",
                "--workload",
                str(trace),
                "--slo",
                f"ttft_max_ms={limit_ms:.3f}",
                "--model",
                "tiny-random",
                "--hardware",
                "cpu",
                "--preset",
                "vllm-prefix",
                "--kv-dtype",
                "fp16",
                "--max-nodes",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads((out / "plan.json").read_text())["results"][0]
    assert result["nodes_needed"] == expected
    points = {p["nodes"]: p for p in result["points"]}
    assert sorted(points) == [1, 2, 3]  # doubling stops at 2 (1 failed, nothing to bisect), then the check at 3
    assert points[1]["meets"] is False and points[2]["meets"] is True and points[3]["meets"] is True
    assert points[1]["values"]["ttft_max_ms"] == pytest.approx(worst_ttft_s(1, service, gap) * 1000, rel=1e-6)
    assert points[2]["values"]["ttft_max_ms"] == pytest.approx(service * 1000, rel=1e-6)
    assert points[2]["node_hours"] == pytest.approx(2 * points[2]["virtual_s"] / 3600)
    assert result["non_monotone"] == []
    assert (out / "plan.md").is_file() and (out / "plan_slo_vs_nodes.png").stat().st_size > 0


def point(nodes: int, meets: bool, value: float) -> PlanPoint:
    return PlanPoint(nodes, {"ttft_p99_ms": value}, meets, 10, 0, 1.0, 100.0, nodes / 36, nodes / 36, 0.0)


def test_search_doubles_then_bisects_and_reports_a_verdict_that_flips_back():
    tried = []

    def evaluate(n):  # meets from 6 nodes on, except at 7
        tried.append(n)
        return point(n, n >= 6 and n != 7, 1000.0 / n)

    search = search_nodes(evaluate, max_nodes=64, targets=parse_slo("ttft_p99_ms=200"))
    assert search.answer == 6
    assert tried == [1, 2, 4, 8, 6, 5, 7]  # 8 met; bisect 4..8: 6 met, 5 failed; then the check at 7
    assert search.non_monotone == ("6 nodes meet the SLO but 7 do not",)


def test_search_says_when_even_max_nodes_miss():
    search = search_nodes(lambda n: point(n, False, 900.0), max_nodes=5)
    assert search.answer is None and [p.nodes for p in search.points] == [1, 2, 4, 5]


def test_slo_parser_reads_targets_and_names_what_it_cannot_read():
    targets = parse_slo("ttft_p99_ms=500, tpot_p50_ms=40, queue_wait_max_ms=2e3")
    assert [(t.metric, t.stat, t.limit_ms) for t in targets] == [
        ("ttft", "p99", 500.0),
        ("tpot", "p50", 40.0),
        ("queue_wait", "max", 2000.0),
    ]
    for text, message in (
        ("ttfb_p99_ms=500", "unknown SLO metric 'ttfb'"),
        ("ttft_p42_ms=5", "unknown statistic"),
        ("ttft_p99=500", "METRIC_STAT_ms=LIMIT"),
        ("ttft_p99_ms=-1", "must be a number of ms > 0"),
        ("ttft_p99_ms=1,ttft_p99_ms=2", "given twice"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_slo(text)


@pytest.fixture(scope="module")
def chats():
    return load_workload("rag-chat-mini", num_sessions=12, seed=3)


def by_session(result, workload):
    return {
        s.session_id: {result.node_of[f"{s.session_id}/{t}"] for t in range(len(s.turns))} for s in workload.sessions
    }


@pytest.mark.parametrize("preset", ["vllm-prefix", "sglang-radix"])
def test_session_and_prefix_routing_keep_every_turn_of_a_session_on_one_node(chats, preset):
    base = get_preset(preset)
    config = SimConfig(
        load_geometry("qwen2.5-72b"),
        load_hardware("8xh200"),
        base.__class__(**{**{f: getattr(base, f) for f in base.__slots__}, "num_nodes": 3}),
        "fp8",
        "fp8",
    )
    result = simulate(chats, LoadSpec(), config)
    nodes = by_session(result, chats)
    assert all(len(used) == 1 for used in nodes.values())  # sticky: one node per session
    assert len(set().union(*nodes.values())) > 1  # and the sessions are spread over the nodes
    later = [r for r in result.records if r.turn > 0]
    assert later and all(r.reusable_tokens - r.cached_tokens < 16 for r in later)  # so later turns hit their KV


def test_round_robin_moves_a_session_between_nodes_and_loses_its_cache(chats):
    base = get_preset("vllm-prefix")
    fields = {f: getattr(base, f) for f in base.__slots__}
    config = SimConfig(
        load_geometry("qwen2.5-72b"),
        load_hardware("8xh200"),
        base.__class__(**{**fields, "num_nodes": 3, "route": ROUTE_ROUND_ROBIN}),
        "fp8",
        "fp8",
    )
    result = simulate(chats, LoadSpec(), config)
    assert any(len(used) > 1 for used in by_session(result, chats).values())
    later = [r for r in result.records if r.turn > 0]
    assert any(r.reusable_tokens - r.cached_tokens >= 16 for r in later)


def test_the_cache_aware_router_spreads_a_burst_of_new_sessions(chats):
    """All 12 sessions ready at once (closed loop): no node caches anything yet, so SGLang's router sends each
    new session to the node whose tree (cache plus prompts routed there) is smallest. Counting only the device
    cache, which fills only after a prefill has run, sent the whole burst to node 0."""
    base = get_preset("sglang-radix")
    fields = {f: getattr(base, f) for f in base.__slots__}
    config = SimConfig(
        load_geometry("qwen2.5-72b"),
        load_hardware("8xh200"),
        base.__class__(**{**fields, "num_nodes": 3}),
        "fp8",
        "fp8",
    )
    result = simulate(chats, LoadSpec(concurrency=12), config)
    first = [result.node_of[f"{s.session_id}/0"] for s in chats.sessions]
    assert sorted(first.count(n) for n in range(3)) == [4, 4, 4]
