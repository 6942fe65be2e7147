"""calibrate --published: the router latency solved exactly, and a fit that recovers what made the data."""

import dataclasses
import json

import pytest

from kvbench.sim.calibrate_published import (
    START,
    best_router_latency,
    fit_published,
    transfer,
)
from kvbench.sim.hardware import load_hardware, save_hardware
from kvbench.sim.published import Fit, Row, compare_arm, parse_case

CASE = """
name: fit-case
hardware: {profile: h100, devices_per_replica: 2, replicas: 2}
model: qwen3-32b
engine: {name: vllm, block_size: 64, gpu_memory_utilization: 0.9, max_num_seqs: 64, max_num_batched_tokens: 2048}
workload: {generator: shared_prefix, num_groups: 2, num_prompts_per_group: 2, system_prompt_len: 1024,
           question_len: 256, output_len: 24}
stages: {warmup: "2:1", ladder: "2:3,6:2"}
routers: [precise-prefix]
published:
  precise-prefix: {PUBLISHED}
"""


def test_the_router_latency_lifts_simulated_ttft_onto_published():
    rows = [
        Row("p", "3", "ttft_mean_s", 0.15, 0.10),
        Row("p", "10", "ttft_p90_s", 0.25, 0.20),
        Row("p", "3", "output_tok_s", 100.0, 50.0),
    ]  # throughput rows play no part
    assert best_router_latency(rows) == pytest.approx(0.05, abs=1e-3)
    assert best_router_latency([Row("p", "3", "ttft_mean_s", 0.1, 0.3)]) == 0.0  # never negative


def test_a_fit_recovers_the_speeds_that_made_the_published_values(tmp_path):
    truth = Fit(0.5, 0.6, 0.004, 0.03, "truth")
    # The roofline's H100: where measured kernel tables price the steps (the default) the efficiencies move nothing.
    roofline = tmp_path / "h100-roofline.json"
    h100 = load_hardware("h100")
    save_hardware(dataclasses.replace(h100, device=dataclasses.replace(h100.device, kernel_tables=False)), roofline)
    path = tmp_path / "case.yaml"
    case_text = CASE.replace("profile: h100", f"profile: {roofline}")
    path.write_text(case_text.replace("{PUBLISHED}", "{output_tok_s: [1, 1]}"))
    made = compare_arm(parse_case(path), "precise-prefix", truth).rows
    published = {
        m: [next(r.simulated for r in made if r.stage == s and r.metric == m) for s in ("2", "6")]
        for m in ("output_tok_s", "ttft_mean_s", "ttft_p90_s")
    }
    path.write_text(case_text.replace("{PUBLISHED}", json.dumps(published)))
    case = parse_case(path)
    result = fit_published(case, "precise-prefix", max_rate=10, max_evaluations=14)
    first, best = result.evaluations[0], min(result.evaluations, key=lambda e: e.cost)
    assert best.cost < first.cost and result.fit == best.fit
    assert result.fit.bw_efficiency == pytest.approx(0.6, rel=0.15)  # decode-bound outputs pin the bandwidth
    assert all(abs(r.ratio - 1) < 0.1 for r in result.rows if r.ratio is not None)
    h200 = transfer(result.fit, load_hardware("8xh200"))
    assert h200.device.bw_efficiency == result.fit.bw_efficiency and h200.device.memory_bw == 4.8e12
    assert START.router_latency_s == 0.0


def test_a_saturated_stage_adds_its_throughput_alone_to_the_fit(tmp_path):
    path = tmp_path / "case.yaml"
    path.write_text(CASE.replace("{PUBLISHED}", "{output_tok_s: [400, 900], ttft_mean_s: [0.2, 0.3]}"))
    case = parse_case(path)
    result = fit_published(case, "precise-prefix", max_rate=2, max_evaluations=4, throughput_rates=[6])
    assert set(result.fit.fitted_rows) == {
        "precise-prefix/2/output_tok_s",
        "precise-prefix/2/ttft_mean_s",
        "precise-prefix/6/output_tok_s",
    }  # 6/s: its TTFT stays a check
    assert "output tok/s at 6/s" in result.fit.fitted_on
    assert result.to_dict()["fitted_on"]["throughput_rates"] == [6]
    with pytest.raises(ValueError, match="no stage at 7/s"):
        fit_published(case, "precise-prefix", max_rate=2, max_evaluations=1, throughput_rates=[7])


def test_fitted_values_are_marked_and_left_out_of_the_targets(tmp_path):
    from kvbench.sim.published import load_fit
    from kvbench.sim.published_report import check_targets, write_comparison

    rows = [
        Row("precise-prefix", "3", "output_tok_s", 100.0, 100.0),
        Row("precise-prefix", "60", "output_tok_s", 100.0, 50.0),
    ]  # 0.5: off by far more than 20%
    assert check_targets(rows, ["3", "60"])[0].met is False
    fitted = ("precise-prefix/60/output_tok_s",)
    assert check_targets(rows, ["3", "60"], fitted)[0].met is True
    md, js = write_comparison(tmp_path, "c", rows, check_targets(rows, ["3", "60"], fitted), [], fitted)
    assert "0.50 (fit)" in md.read_text() and "1.00 (fit)" not in md.read_text()
    assert [r["fitted"] for r in json.loads(js.read_text())["rows"]] == [False, True]
    fit_json = tmp_path / "fit.json"
    fit_json.write_text(
        json.dumps(
            {
                "fit": {
                    "flops_efficiency": 0.5,
                    "bw_efficiency": 0.9,
                    "step_overhead_s": 0.002,
                    "fitted_rows": list(fitted),
                }
            }
        )
    )
    assert load_fit(fit_json).fitted_rows == fitted


def test_one_fit_across_cases_recovers_the_step_overhead_that_made_both(tmp_path):
    from kvbench.sim.calibrate_published import FitPart, fit_across

    staged = (
        CASE.replace("profile: h100", "profile: cpu")
        .replace("model: qwen3-32b", "model: tiny-random")
        .replace("block_size: 64", "block_size: 4")
        .replace("system_prompt_len: 1024", "system_prompt_len: 32")
        .replace("question_len: 256", "question_len: 4")
    )
    loop = staged.replace(
        'stages: {warmup: "2:1", ladder: "2:3,6:2"}', "load: {closed_loop: {concurrency: 2, num_requests: 6}}"
    ).replace("fit-case", "loop-case")
    truth = Fit(START.flops_efficiency, START.bw_efficiency, 0.006, 0.02, "truth")
    paths = []
    for name, text, published in (("a.yaml", staged, "{output_tok_s: [1, 1]}"), ("b.yaml", loop, "{output_tok_s: 1}")):
        path = tmp_path / name
        path.write_text(text.replace("{PUBLISHED}", published))
        made = compare_arm(parse_case(path), "precise-prefix", truth).rows
        if "stages" in text:
            values = {
                m: [next(r.simulated for r in made if r.stage == s and r.metric == m) for s in ("2", "6")]
                for m in ("output_tok_s", "ttft_mean_s", "ttft_p90_s")
            }
        else:
            values = {
                m: next(r.simulated for r in made if r.stage == "whole" and r.metric == m)
                for m in ("output_tok_s", "ttft_mean_s")
            }
        path.write_text(text.replace("{PUBLISHED}", json.dumps(values)))
        paths.append(path)
    parts = [FitPart(parse_case(p), "precise-prefix", 10) for p in paths]
    result = fit_across(parts, max_evaluations=10)
    assert result.fit.step_overhead_s == pytest.approx(0.006, abs=0.001)
    assert result.fit.router_latency_s == pytest.approx(0.02, abs=0.005)
    assert {k.split("/")[0] for k in result.fit.fitted_rows} == {"fit-case", "loop-case"}
    assert result.fit.rows_of("loop-case") == ("precise-prefix/whole/output_tok_s", "precise-prefix/whole/ttft_mean_s")
    with pytest.raises(ValueError, match="one fit per GPU type"):
        fit_across([parts[0], FitPart(dataclasses.replace(parts[1].case, hardware="h200"), "precise-prefix", 10)])
