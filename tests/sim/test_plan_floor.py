"""kvbench plan's floor at unbounded nodes: one long prompt sets the TTFT max floor; an SLO below it is
answered at once, without simulating a single node count."""

import dataclasses
import json

import pytest

from kvbench.cli.main import main
from kvbench.sim.config import SimConfig
from kvbench.sim.cost import SeqWork
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.plan import parse_slo
from kvbench.sim.plan_floor import request_floors, slo_floors, unreachable
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload
from kvbench.workloads.shared_prefix import SharedPrefixParams, generate_shared_prefix

LONG = 20000


@pytest.fixture
def trace(tmp_path):
    """Ten short prompts sharing a 512-token context, then one long unique prompt."""
    path = tmp_path / "trace.jsonl"
    lines = [
        {
            "session_id": f"s{i}",
            "turn": 0,
            "arrival_s": i * 0.1,
            "max_tokens": 8,
            "context_length": 512,
            "user_length": 32,
        }
        for i in range(10)
    ]
    lines.append({"session_id": "long", "turn": 0, "arrival_s": 2.0, "max_tokens": 8, "context_length": LONG})
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def config() -> SimConfig:
    return SimConfig(load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset("vllm-prefix"), "fp8", "fp8")


def test_the_long_prompt_prefilled_alone_in_step_chunks_is_the_ttft_max_floor(trace):
    workload = load_workload(str(trace))
    cfg = config()
    floors = request_floors(workload, cfg)
    budget = cfg.preset.max_step_tokens
    by_hand = sum(cfg.cost.step([SeqWork(s, min(s + budget, LONG))]).seconds for s in range(0, LONG, budget)) * 1e3
    assert max(floors["ttft"]) == pytest.approx(by_hand)
    assert slo_floors(workload, cfg, parse_slo("ttft_max_ms=1"))["ttft_max_ms"] == pytest.approx(by_hand)
    # Each session's context_length draws its own ids: nothing is shared, and the shortest floor is a whole
    # short prompt (512 + 32 tokens) prefilled alone.
    short = cfg.cost.step([SeqWork(0, 544)]).seconds * 1e3
    assert min(floors["ttft"]) == pytest.approx(short)
    assert unreachable(parse_slo(f"ttft_max_ms={by_hand * 0.9}"), {"ttft_max_ms": by_hand}).startswith(
        f"unreachable: floor {by_hand:,.0f} ms"
    )
    assert unreachable(parse_slo(f"ttft_max_ms={by_hand * 1.1}"), {"ttft_max_ms": by_hand}) is None


def test_a_shared_prefix_lowers_the_floor_of_the_later_prompt():
    workload = generate_shared_prefix(SharedPrefixParams(2, 3, 2048, 64, 8))  # 2 groups of 3 prompts
    cfg = dataclasses.replace(config(), preset=dataclasses.replace(get_preset("vllm-prefix"), page_size=64))
    floors = request_floors(workload, cfg)["ttft"]
    systems = [s.context.tobytes() for s in workload.sessions]
    repeats = [i for i, system in enumerate(systems) if system in systems[:i]]
    assert len(repeats) == 4
    for i in repeats:  # its group's system prompt came earlier: only its question (64 tokens) is new
        assert floors[i] < floors[systems.index(systems[i])] / 3


def test_plan_answers_an_slo_below_the_floor_at_once(trace, tmp_path, capsys):
    out = tmp_path / "plan"
    assert (
        main(
            [
                "plan",
                "--workload",
                str(trace),
                "--slo",
                "ttft_max_ms=50",
                "--model",
                "qwen2.5-72b",
                "--preset",
                "vllm-prefix",
                "--max-nodes",
                "64",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "unreachable: floor" in printed
    doc = json.loads((out / "plan.json").read_text())
    result = doc["results"][0]
    assert result["nodes_needed"] is None and result["points"] == []  # not one node count simulated
    assert result["unreachable"].startswith("unreachable: floor") and result["floors_ms"]["ttft_max_ms"] > 50
