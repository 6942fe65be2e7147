"""Published cases: the case file's door, `kvbench validate-published` on a small case, and simulate's stages."""

import json

import pytest

from kvbench.cli.main import main
from kvbench.measure.metrics import summarize_run
from kvbench.sim.published import CaseError, case_config, case_workload, parse_case
from kvbench.sim.staged import simulate_stages

CASE = """
name: tiny-case
source: {repository: example/repo, report: README.md}
hardware: {profile: cpu, devices_per_replica: 1, replicas: 2}
model: tiny-random
engine: {name: vllm, block_size: 4, gpu_memory_utilization: 0.5, max_num_seqs: 8, max_num_batched_tokens: 64,
         kv_dtype: bf16}
workload: {generator: shared_prefix, num_groups: 2, num_prompts_per_group: 2, system_prompt_len: 16,
           question_len: 4, output_len: 3}
stages: {warmup: "2:1", ladder: "2:2,4:1"}
routers: [round-robin]
published:
  round-robin:
    output_tok_s: [10, 20]
    ttft_mean_s: [0.01, null]
whole_ladder:
  round-robin: {itl_mean_ms: 5.0}
"""


@pytest.fixture
def case_file(tmp_path):
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    return path


def test_validate_published_prints_published_simulated_and_ratios(case_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["validate-published", str(case_file), "--out", str(out)]) == 0
    doc = json.loads((out / "comparison.json").read_text())
    rows = {(r["stage"], r["metric"]): r for r in doc["rows"]}
    # The simulated values are those of each stage's own records: simulate the case again, by hand.
    case = parse_case(case_file)
    config = case_config(case, "round-robin")
    staged = simulate_stages(case_workload(case, config.geometry.vocab_size), case.plan, config)
    assert [len(s) for s in staged.stage_records] == [4, 4]  # the 2 warm-up requests are in no stage
    assert sum(r.warmup for r in staged.result.records) == 2
    for stage, records in zip(("2", "4"), staged.stage_records):
        summary = summarize_run(list(records)).overall
        assert rows[(stage, "output_tok_s")]["simulated"] == pytest.approx(summary.output_tok_s)
        assert rows[(stage, "ttft_p90_s")]["simulated"] == pytest.approx(summary.ttft_ms.p90 / 1e3)
    first = rows[("2", "output_tok_s")]
    assert first["published"] == 10 and first["ratio"] == pytest.approx(first["simulated"] / 10)
    assert rows[("4", "ttft_mean_s")]["published"] is None and rows[("4", "ttft_mean_s")]["ratio"] is None
    assert rows[("whole", "itl_mean_ms")]["published"] == 5.0
    printed = capsys.readouterr().out
    assert "published | simulated | ratio" in printed and f"{first['ratio']:.2f}" in printed
    assert "## round-robin" in (out / "comparison.md").read_text()
    assert "seeds" not in doc and not list(out.glob("seed-*"))  # one seed: the one comparison, as before --seeds


def test_a_later_stage_starts_after_the_earlier_one_drained(case_file):
    case = parse_case(case_file)
    config = case_config(case, "round-robin")
    staged = simulate_stages(case_workload(case, config.geometry.vocab_size), case.plan, config)
    warmup = [r for r in staged.result.records if r.warmup]
    ends = [max(r.done_ns for r in rs) for rs in ([*warmup],) + staged.stage_records]
    starts = [min(r.sent_ns for r in rs) for rs in ([*warmup],) + staged.stage_records]
    for end, start in zip(ends, starts[1:]):
        assert start == pytest.approx(end + 1e9, abs=1)  # the 1 s interval after the last completion


@pytest.mark.parametrize(
    "edit, message",
    [
        (('ladder: "2:2,4:1"', 'ladder: "2:2"'), "give 1 numbers"),
        (("routers: [round-robin]", "routers: [ring]"), "routers"),
        (("gpu_memory_utilization: 0.5", "gpu_memory_utilization: 1.5"), "gpu_memory_utilization"),
    ],
)
def test_a_bad_case_file_is_one_line_naming_the_field(tmp_path, capsys, edit, message):
    path = tmp_path / "bad.yaml"
    path.write_text(CASE.replace(*edit))
    with pytest.raises(CaseError, match=message):
        parse_case(path)
    assert main(["validate-published", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.split()[0] in err


def simulate_fleet_argv(
    tmp_path, route: str, prompts_per_group: int, system: int, question: int, output: int
) -> list[str]:
    """`kvbench simulate` of a 2-node tiny fleet behind `route` on a shared-prefix workload of 2 groups."""
    params = tmp_path / "sp.yaml"
    params.write_text(
        f"generator: shared_prefix\nnum_groups: 2\nnum_prompts_per_group: {prompts_per_group}\n"
        f"system_prompt_len: {system}\nquestion_len: {question}\noutput_len: {output}\n"
    )
    return [
        "simulate",
        "--model",
        "tiny-random",
        "--hardware",
        "cpu",
        "--workload",
        str(params),
        "--preset",
        "vllm-prefix",
        "--kv-dtype",
        "fp16",
        "--nodes",
        "2",
        "--route",
        route,
        "--page-size",
        "4",
    ]


def test_simulate_runs_stages_on_a_fleet(tmp_path):
    out = tmp_path / "run"
    argv = simulate_fleet_argv(tmp_path, "precise-prefix", 2, 16, 4, 3) + [
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "32",
        "--stages",
        "2:2,4:1",
        "--warmup-stage",
        "2:1",
        "--no-plots",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [e["load"] for e in summary["runs"]] == ["rate=2", "rate=4"]
    assert [e["summary"]["overall"]["requests"] for e in summary["runs"]] == [4, 4]
    assert main(argv[:-2] + ["--rate", "2", "--out", str(tmp_path / "x")]) == 2


def test_a_subsampled_fleet_keeps_each_replicas_load_and_scales_throughput_back(case_file):
    from kvbench.sim.published import compare_arm, subsample

    case = parse_case(case_file)
    half = subsample(case, 1)
    assert half.replicas == 1 and half.fleet_scale == 2.0
    assert [s.rate for s in half.plan.stages] == [1.0, 2.0] and half.plan.warmup.rate == 1.0
    run = compare_arm(half, "round-robin")
    first = summarize_run(list(run.stage_records[0])).overall
    row = next(r for r in run.rows if r.stage == "2" and r.metric == "output_tok_s")  # labelled by the full rate
    assert row.simulated == pytest.approx(first.output_tok_s * 2)
    with pytest.raises(CaseError, match="replicas"):
        subsample(case, 3)


def test_across_seeds_takes_each_values_median_and_range_over_the_seeds():
    from kvbench.sim.published import Row, across_seeds

    def seed(ttft: float | None, out: float) -> list[Row]:
        return [
            Row("precise-prefix", "40", "ttft_mean_s", 0.5, ttft),
            Row("precise-prefix", "40", "output_tok_s", 100.0, out),
        ]

    ttft, out = across_seeds([seed(1.5, 90.0), seed(0.3, 120.0), seed(0.6, 100.0), seed(None, 80.0)])
    # ttft: seeds 0-2 measured it (0.3, 0.6, 1.5), seed 3 did not: the median of the three, not of four with a 0.
    assert ttft.row.simulated == pytest.approx(0.6) and (ttft.low, ttft.high) == (0.3, 1.5)
    assert ttft.per_seed == (1.5, 0.3, 0.6, None) and ttft.row.ratio == pytest.approx(0.6 / 0.5)
    assert out.row.simulated == pytest.approx(95.0) and (out.low, out.high) == (80.0, 120.0)  # even: middle two's mean
    assert out.row.published == 100.0 and out.row.key == "precise-prefix/40/output_tok_s"


def test_the_targets_over_seeds_are_judged_on_the_medians():
    from kvbench.sim.published import Row, across_seeds
    from kvbench.sim.published_report import check_targets

    seeds = [[Row("precise-prefix", "40", "ttft_mean_s", 0.5, ttft)] for ttft in (1.05, 0.5, 0.6)]  # 2.1x, 1x, 1.2x
    assert check_targets(seeds[0], ["40"])[2].met is False  # seed 0 alone misses the 2x target
    median = check_targets([s.row for s in across_seeds(seeds)], ["40"])[2]
    assert median.met is True and median.detail == "all within"  # its median across seeds (1.2x) meets it


def test_validate_published_over_seeds_writes_each_seed_and_their_medians(case_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["validate-published", str(case_file), "--seeds", "0,1,2", "--out", str(out)]) == 0
    doc = json.loads((out / "comparison.json").read_text())
    each = [json.loads((out / f"seed-{s}" / "comparison.json").read_text()) for s in (0, 1, 2)]
    assert doc["seeds"] == [0, 1, 2] and any(h.startswith("seeds: 3 (0, 1, 2)") for h in doc["header"])
    per_seed = [{(r["stage"], r["metric"]): r["simulated"] for r in e["rows"]} for e in each]
    assert per_seed[0] != per_seed[1]  # the seeds draw different arrivals: the spread is real
    for row in doc["rows"]:
        values = [seed[(row["stage"], row["metric"])] for seed in per_seed]
        assert row["per_seed"] == values
        assert row["simulated"] == pytest.approx(sorted(values)[1])  # the median of three
        assert (row["low"], row["high"]) == (min(values), max(values))
        if row["published"] is not None:
            assert row["ratio"] == pytest.approx(row["simulated"] / row["published"])
    # The targets are those of the medians: the worst output tok/s stage is named with its median's ratio.
    out_rows = [r for r in doc["rows"] if r["metric"] == "output_tok_s" and r["stage"] != "whole"]
    worst = max(out_rows, key=lambda r: abs(r["ratio"] - 1))
    assert doc["targets"][0]["detail"] == f"worst round-robin {worst['stage']}/s: {worst['ratio']:.2f}"
    assert "seeds: 3 (0, 1, 2)" in capsys.readouterr().out
    assert "(" in (out / "comparison.md").read_text().split("## round-robin")[1].splitlines()[4]  # median (min-max)


@pytest.mark.parametrize("seeds", ["0,x", "0,0", "-1", "", "1.5"])
def test_a_bad_seeds_value_is_one_line_naming_the_flag(case_file, tmp_path, capsys, seeds):
    assert main(["validate-published", str(case_file), "--seeds", seeds, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--seeds" in err and "0,1,2" in err
    assert not (tmp_path / "o").exists()  # refused before anything ran
