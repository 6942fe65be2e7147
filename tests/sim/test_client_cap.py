"""The client's cap on requests in flight (vLLM's `--max-concurrency`, inference-perf's workers x concurrency) on a
tiny simulated fleet: never more than the cap in the servers, the rest waiting in the client, TTFT from the send."""

import dataclasses
import json

import pytest

from kvbench.cli.main import main
from kvbench.measure.metrics import ttft_from_schedule_ms, ttft_ms
from kvbench.measure.schedule import LoadSpec
from kvbench.measure.stages import StagePlan
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import ROUTE_PRECISE_PREFIX, ROUTE_ROUND_ROBIN, get_preset
from kvbench.sim.published import CaseError, parse_case, subsample
from kvbench.sim.staged import simulate_stages
from kvbench.workloads.shared_prefix import SharedPrefixParams, generate_shared_prefix
from tests.sim.test_published import CASE, simulate_fleet_argv


def fleet(route: str = ROUTE_ROUND_ROBIN, nodes: int = 2) -> SimConfig:
    preset = dataclasses.replace(get_preset("vllm-prefix"), num_nodes=nodes, route=route, page_size=4)
    return SimConfig(load_geometry("tiny-random"), load_hardware("cpu"), preset, "fp16", device_kv_tokens=4096)


def workload(requests: int = 24):
    return generate_shared_prefix(SharedPrefixParams(2, 3, 32, 8, 6, requests, vocab_size=512), seed=1)


def most_in_flight(records) -> int:
    """The most requests sent and not yet done at any instant (one finishing at t frees its slot before t's send)."""
    edges = sorted([(r.sent_ns, 1) for r in records] + [(r.done_ns, -1) for r in records], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_a_cap_keeps_at_most_c_requests_in_the_servers_and_the_rest_wait_in_the_client():
    # 24 requests at 100,000/s arrive within ~0.3 ms, about what one takes on the cpu profile: most overlap.
    uncapped = simulate(workload(), LoadSpec(rate=1e5), fleet())
    assert most_in_flight(uncapped.records) > 3
    capped = simulate(workload(), LoadSpec(rate=1e5, max_concurrency=3), fleet())
    assert len(capped.records) == 24 and all(r.error is None for r in capped.records)
    assert most_in_flight(capped.records) == 3
    waited = [r for r in capped.records if r.sent_ns > r.planned_ns]
    assert waited  # some were due before a slot was free
    for r in capped.records:
        # TTFT counts from the send (as vLLM's benchmark and inference-perf count it); from schedule, the wait too.
        assert ttft_ms(r) == pytest.approx((r.first_token_ns - r.sent_ns) / 1e6)
        assert ttft_from_schedule_ms(r) == pytest.approx(ttft_ms(r) + (r.sent_ns - r.planned_ns) / 1e6)
        assert r.queued_ns == r.sent_ns  # queued: when the cap let it go
    # First come first: the waiting requests go in the order they were due.
    by_send = sorted(capped.records, key=lambda r: (r.sent_ns, r.planned_ns))
    assert [r.planned_ns for r in by_send] == sorted(r.planned_ns for r in capped.records)
    # A request sent after waiting goes when another finishes.
    done = {r.done_ns for r in capped.records}
    assert all(r.sent_ns in done for r in waited)


def test_a_cap_never_reached_changes_nothing():
    plain = simulate(workload(), LoadSpec(rate=20.0), fleet(ROUTE_PRECISE_PREFIX))
    roomy = simulate(workload(), LoadSpec(rate=20.0, max_concurrency=1000), fleet(ROUTE_PRECISE_PREFIX))
    assert [(r.request_id, r.sent_ns, r.first_token_ns, r.done_ns) for r in plain.records] == [
        (r.request_id, r.sent_ns, r.first_token_ns, r.done_ns) for r in roomy.records
    ]


def test_stages_under_a_cap_keep_the_cap_and_stage_ttft_from_the_send():
    plan = StagePlan.parse("50000:0.0004,100000:0.0002", warmup="50000:0.0002")
    staged = simulate_stages(workload(plan.total_requests), plan, fleet(), max_concurrency=2)
    records = [r for stage in staged.stage_records for r in stage]
    assert most_in_flight(staged.result.records) == 2
    assert any(r.sent_ns > r.planned_ns for r in records)
    summary = staged.stage_summaries()[0]
    first = staged.stage_records[0]
    assert summary.ttft_ms.mean == pytest.approx(sum(ttft_ms(r) for r in first) / len(first))


def test_the_case_file_states_the_cap_and_a_subsampled_fleet_gets_its_share(tmp_path):
    path = tmp_path / "case.yaml"
    path.write_text(CASE + "client: {max_concurrency: 6}\n")
    case = parse_case(path)
    assert case.max_concurrency == 6
    assert subsample(case, 1).max_concurrency == 3
    path.write_text(CASE)
    assert parse_case(path).max_concurrency is None
    path.write_text(CASE + "client: {max_concurrency: many}\n")
    with pytest.raises(CaseError, match="client.max_concurrency"):
        parse_case(path)


def test_the_shipped_case_caps_the_client():
    from pathlib import Path

    case = parse_case(Path("results/sim/published/llm-d-precise-prefix.yaml"))
    assert case.max_concurrency is not None and case.max_concurrency >= case.replicas


def test_simulate_takes_max_concurrency(tmp_path):
    out = tmp_path / "run"
    argv = simulate_fleet_argv(tmp_path, "round-robin", 3, 32, 8, 6) + [
        "--num-sessions",
        "12",
        "--rate",
        "100000",
        "--max-concurrency",
        "2",
        "--no-plots",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert doc["runs"][0]["load"] == "rate=100000,max=2"
    closed = argv[: argv.index("--rate")] + [
        "--concurrency",
        "2",
        "--max-concurrency",
        "2",
        "--out",
        str(tmp_path / "x"),
    ]
    assert main(closed) == 2  # a closed loop's concurrency is its cap already
