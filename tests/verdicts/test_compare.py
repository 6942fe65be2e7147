"""The nightly gate on synthetic run folders written with the real `summarize_run` / `write_summaries`.

Requests have realistic noise: lognormal TTFTs (sigma 0.4), per-request ITL levels with per-gap noise,
Poisson arrivals, varied output lengths and cached-token counts; 200 requests per folder.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvbench.cli import commands
from kvbench.cli.commands import compare_cmd
from kvbench.measure.bootstrap import weighted_percentile
from kvbench.measure.metrics import summarize_run
from kvbench.measure.records import RecordWriter, RequestRecord
from kvbench.measure.report import write_summaries
from kvbench.measure.run_folder import REQUESTS_JSONL, RunEntry, read_run_folder
from kvbench.verdicts.baseline import PROVENANCE_JSON, promote
from kvbench.verdicts.compare import CompareOptions, Verdict, compare
from kvbench.verdicts.gate_metrics import PERF_METRICS, RequestSamples

MS = 1_000_000
RUN_ID = "ours|rag-chat-mini|c4|r{}"
SEEDS = range(20)


def make_records(seed, run_id=RUN_ID.format(0), n=200, ttft_factor=1.0, hit=0.8, report_cached=True, noise=1.0):
    """`noise` scales every spread (1: the realistic default; 0.1: a quiet machine whose runs can be resolved)."""
    rng = np.random.default_rng(seed)
    sent = np.cumsum(0.25 + noise * (rng.exponential(0.25, n) - 0.25)) * 1e9
    records = []
    for i in range(n):
        start = int(sent[i])
        ttft = rng.lognormal(np.log(200), 0.4 * noise) * ttft_factor
        tokens = 32 + round(noise * (int(rng.integers(16, 48)) - 32))
        level = rng.lognormal(np.log(20), 0.2 * noise)
        time_ns = start + int(ttft * MS)
        chunks = [[time_ns, 1]]
        for gap in rng.lognormal(np.log(level), 0.3 * noise, tokens - 1):
            time_ns += int(gap * MS)
            chunks.append([time_ns, 1])
        prompt = int(rng.integers(1000, 3000))
        reusable = int(prompt * (0.55 + noise * (rng.uniform(0.3, 0.8) - 0.55)))
        records.append(
            RequestRecord(
                run_id=run_id,
                request_id=f"q{i}",
                session_id=f"s{i}",
                tenant="a",
                turn=0,
                queued_ns=start,
                sent_ns=start,
                first_token_ns=chunks[0][0],
                done_ns=time_ns,
                chunks=chunks,
                prompt_tokens=prompt,
                output_tokens=tokens,
                cached_tokens=int(rng.binomial(reusable, hit)) if report_cached else None,
                reusable_tokens=reusable,
            )
        )
    return records


def entry(records, repeat=0, engine="ours", load="c4", params=None):
    return RunEntry(
        run_id=records[0].run_id,
        engine=engine,
        kv_dtype="fp16",
        workload="rag-chat-mini",
        load=load,
        repeat=repeat,
        workload_params=params or {"turns_mean": 4},
        engine_settings={},
        summary=summarize_run(records).to_dict(),
        valid=True,
        started_at=1.7e9,
    )


def write_run(path: Path, entries_records, config=None, env=None) -> Path:
    """A run folder as the runner writes it: requests.jsonl, summary.{json,csv,md}, config.yaml, env.json."""
    path.mkdir(parents=True, exist_ok=True)
    with RecordWriter(path / REQUESTS_JSONL) as writer:
        for _, records in entries_records:
            for record in records:
                writer.write(record)
    write_summaries(path, [item for item, _ in entries_records])
    (path / "config.yaml").write_text(yaml.safe_dump(config or {"seed": 0, "repeat": 1, "stop": {"num_requests": 200}}))
    (path / "env.json").write_text(
        json.dumps(
            env
            or {
                "cpu": "test cpu",
                "cpu_count": 2,
                "gpu": [],
                "git_commit": "abc123",
                "command": "kvbench run ci/nightly-cpu.yaml",
            }
        )
    )
    return path


def simple_run(path: Path, seed: int, **kwargs) -> Path:
    records = make_records(seed, **kwargs)
    return write_run(path, [(entry(records), records)])


def cli(argv) -> int:
    """`kvbench ...` through the real CLI once the lead registers compare_cmd; until then the same parser wiring."""
    if compare_cmd in commands.ALL:
        from kvbench.cli.main import main

        return main(argv)
    parser = argparse.ArgumentParser(prog="kvbench")
    compare_cmd.register(parser.add_subparsers(), argparse.HelpFormatter)
    args = parser.parse_args(argv)
    return args.handler(args)


def row(comparison, metric, kind="perf"):
    (found,) = [item for item in comparison.rows if item.metric == metric and item.kind == kind]
    return found


# --- the statistics ----------------------------------------------------------------------------------------


def test_weighted_percentile_is_numpy_percentile_of_the_repeated_sample():
    rng = np.random.default_rng(1)
    values = np.sort(rng.lognormal(size=37))
    weights = rng.integers(0, 4, size=(50, 37))
    weights[0] = 0
    weights[1] = 0
    weights[1, 5] = 1  # a single element
    for q in (0, 1, 50, 90, 99, 100):
        got = weighted_percentile(values, weights, q)
        assert np.isnan(got[0])
        want = [np.percentile(np.repeat(values, row), q) for row in weights[1:]]
        np.testing.assert_allclose(got[1:], want, rtol=1e-12)


def test_every_resampled_statistic_reproduces_the_stored_summary_without_resampling():
    records = make_records(3)
    overall = summarize_run(records).to_dict()["overall"]
    samples = RequestSamples.of(records)
    identity = np.ones((1, samples.size), dtype=np.int32)
    for name, metric in PERF_METRICS.items():
        assert metric.statistic(samples, identity)[0] == pytest.approx(metric.stored(overall), rel=1e-9), name


# --- verdicts ----------------------------------------------------------------------------------------------


def test_a_real_ttft_regression_fails_the_cli_with_exit_1(tmp_path, capsys):
    # Seeds of the power test below (which shows how often a shift this size is caught at all).
    base = simple_run(tmp_path / "base", seed=1000)
    new = simple_run(tmp_path / "new", seed=5000, ttft_factor=1.2)
    assert cli(["compare", str(base), str(new), "--out", str(tmp_path / "compare.md")]) == 1
    comparison = compare(read_run_folder(base), read_run_folder(new))
    ttft = row(comparison, "ttft_p50")
    assert ttft.verdict is Verdict.REGRESSION
    assert ttft.ci_low > 0 and ttft.delta > 0.05
    assert row(comparison, "output_tok_s").verdict is not Verdict.REGRESSION
    text = (tmp_path / "compare.md").read_text()
    assert "## Regressions" in text and "REGRESSION" in text and "ttft_p50" in text
    assert cli(["compare", str(base), str(new), "--format", "csv", "--metrics", "ttft_p50"]) == 1
    csv_lines = capsys.readouterr().out.strip().splitlines()
    assert csv_lines[-1].startswith("perf,ours|rag-chat-mini|c4,fp16,ttft_p50,lower,relative,")
    assert ",regression," in csv_lines[-1]


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    root = tmp_path_factory.mktemp("baselines")
    return {seed: read_run_folder(simple_run(root / f"b{seed}", seed=1000 + seed)) for seed in SEEDS}


@pytest.mark.slow
def test_no_false_alarm_between_two_draws_of_the_same_distribution(baselines, tmp_path):
    alarms = []
    for seed in SEEDS:
        new = read_run_folder(simple_run(tmp_path / f"n{seed}", seed=5000 + seed))
        comparison = compare(baselines[seed], new)
        alarms += [f"seed {seed}: {item.metric} {item.delta:+.3f}" for item in comparison.regressions]
    rate = len({alarm.split(":")[0] for alarm in alarms}) / len(SEEDS)
    print(f"\nfalse-alarm rate (same distribution, {len(SEEDS)} seeds, default metrics): {rate:.2f} {alarms}")
    assert rate <= 1 / 20


@pytest.mark.slow
def test_power_a_20_percent_ttft_shift_is_caught_in_most_seeds(baselines, tmp_path):
    caught = 0
    for seed in SEEDS:
        new = read_run_folder(simple_run(tmp_path / f"n{seed}", seed=5000 + seed, ttft_factor=1.2))
        caught += (
            row(compare(baselines[seed], new, CompareOptions(metrics=("ttft_p50",))), "ttft_p50").verdict
            is Verdict.REGRESSION
        )
    print(f"\ndetection rate of a +20% TTFT shift (ttft_p50, 200 requests, sigma 0.4): {caught}/{len(SEEDS)}")
    assert caught >= 14


def test_improvement_is_detected_and_does_not_fail(tmp_path):
    base = simple_run(tmp_path / "base", seed=11, hit=0.6)
    new = simple_run(tmp_path / "new", seed=12, ttft_factor=0.7, hit=0.8)
    comparison = compare(read_run_folder(base), read_run_folder(new))
    assert row(comparison, "ttft_p50").verdict is Verdict.IMPROVEMENT
    hit = row(comparison, "cache_hit_rate")
    assert hit.verdict is Verdict.IMPROVEMENT
    assert hit.spec.scale == "points" and 0.05 < hit.delta < 0.15  # percentage points, not relative
    assert row(comparison, "prefill_recompute_rate").verdict is Verdict.IMPROVEMENT
    assert comparison.exit_code() == 0
    assert cli(["compare", str(base), str(new)]) == 0


def test_the_tolerance_keeps_a_small_but_certain_shift_from_alarming(tmp_path):
    records = make_records(5)
    slower = make_records(5, ttft_factor=1.03)  # the same requests, 3% slower: certain, but within 5%
    base = write_run(tmp_path / "base", [(entry(records), records)])
    new = write_run(tmp_path / "new", [(entry(slower), slower)])
    comparison = compare(read_run_folder(base), read_run_folder(new), CompareOptions(metrics=("ttft_p50",)))
    ttft = row(comparison, "ttft_p50")
    assert ttft.delta == pytest.approx(0.03, abs=1e-3)
    # 200 requests a side cannot tell 3% from 5%: the interval reaches past the tolerance, so no verdict either way
    assert ttft.verdict is Verdict.INCONCLUSIVE and ttft.ci_low < 0 < 0.05 < ttft.ci_high
    wide = CompareOptions(metrics=("ttft_p50",), tolerances={"ttft_p50": 0.20})
    assert row(compare(read_run_folder(base), read_run_folder(new), wide), "ttft_p50").verdict is Verdict.NO_CHANGE
    big = simple_run(tmp_path / "big", seed=77, ttft_factor=1.2)
    assert cli(["compare", str(base), str(big), "--metrics", "ttft_p50", "--max-regression", "ttft_p50=40"]) == 0
    assert cli(["compare", str(base), str(big), "--metrics", "ttft_p50"]) == 1


def test_spread_across_repetitions_widens_the_interval(tmp_path):
    def folder(name, factors, seed):
        reps = [make_records(seed + r, RUN_ID.format(r), ttft_factor=f) for r, f in enumerate(factors)]
        return read_run_folder(write_run(tmp_path / name, [(entry(recs, r), recs) for r, recs in enumerate(reps)]))

    options = CompareOptions(metrics=("ttft_p50",))
    steady = row(compare(folder("a", [1, 1, 1], 10), folder("b", [1, 1, 1], 20), options), "ttft_p50")
    spread = row(compare(folder("c", [0.7, 1, 1.3], 10), folder("d", [0.7, 1, 1.3], 20), options), "ttft_p50")
    assert spread.ci_high - spread.ci_low > 1.5 * (steady.ci_high - steady.ci_low)


# --- what does not match is reported -----------------------------------------------------------------------


def test_missing_metric_and_mismatched_settings_are_reported_not_skipped(tmp_path, capsys):
    shared = make_records(1)
    gone = make_records(2, run_id="ours|rag-chat-mini|c8|r0")
    base = write_run(tmp_path / "base", [(entry(shared), shared), (entry(gone, load="c8"), gone)])
    silent = make_records(3, report_cached=False)  # the new engine stopped reporting cached tokens
    added = make_records(4, run_id="vllm|rag-chat-mini|c4|r0")
    new = write_run(
        tmp_path / "new",
        [(entry(silent, params={"turns_mean": 6}), silent), (entry(added, engine="vllm"), added)],
        config={"seed": 0, "repeat": 1, "stop": {"num_requests": 100}},
    )
    comparison = compare(read_run_folder(base), read_run_folder(new))
    hit = row(comparison, "cache_hit_rate")
    assert hit.verdict is Verdict.MISSING and hit.baseline is not None and hit.new is None
    assert "new run" in hit.note
    only = {item.setting: item.note for item in comparison.rows if item.metric == "all"}
    assert "only in the baseline" in only["ours|rag-chat-mini|c8"]
    assert "only in the new run" in only["vllm|rag-chat-mini|c4"]
    text = " | ".join(comparison.mismatches)
    assert "turns_mean: 4 -> 6" in text and "stop.num_requests: 200 -> 100" in text
    assert comparison.exit_code() == 0 and comparison.exit_code(strict=True) == 1
    assert cli(["compare", str(base), str(new)]) == 0
    assert cli(["compare", str(base), str(new), "--strict", "--format", "md"]) == 1
    out = capsys.readouterr().out
    assert "## Mismatches" in out and "turns_mean" in out and "only in the baseline" in out


def test_without_per_request_records_the_tolerance_alone_decides_and_says_so(tmp_path):
    base = simple_run(tmp_path / "base", seed=1)
    new = simple_run(tmp_path / "new", seed=2, ttft_factor=1.3)
    (new / REQUESTS_JSONL).unlink()
    comparison = compare(read_run_folder(base), read_run_folder(new), CompareOptions(metrics=("ttft_p50", "itl_p50")))
    ttft = row(comparison, "ttft_p50")
    assert ttft.ci_low is None and "no per-request records" in ttft.note
    assert ttft.verdict is Verdict.REGRESSION  # +30% > 5%, no interval to say it is noise
    assert row(comparison, "itl_p50").verdict is Verdict.NO_CHANGE


def test_eval_json_quality_deltas_are_judged_by_tolerance(tmp_path):
    base = simple_run(tmp_path / "base", seed=1)
    new = simple_run(tmp_path / "new", seed=1)  # identical serving numbers
    (base / "eval.json").write_text(
        json.dumps(
            {
                "settings": [
                    {
                        "kv_setting": "fp8_e4m3",
                        "metrics": {"kl": 0.010, "top1_agreement": 0.985, "gsm8k/exact_match": 0.60, "mmlu/acc": 0.70},
                    },
                    {"kv_setting": "fp8_e5m2", "metrics": {"kl": 0.02}},
                ]
            }
        )
    )
    (new / "eval.json").write_text(
        json.dumps(
            {
                "settings": [
                    {
                        "kv_setting": "fp8_e4m3",
                        "metrics": {"kl": 0.015, "top1_agreement": 0.983, "gsm8k/exact_match": 0.62, "mmlu/acc": None},
                    },
                ]
            }
        )
    )
    comparison = compare(read_run_folder(base), read_run_folder(new))
    assert row(comparison, "kl", "quality").verdict is Verdict.REGRESSION  # +50% > 10%
    assert row(comparison, "top1_agreement", "quality").verdict is Verdict.NO_CHANGE  # -0.2 pp < 0.5 pp
    assert row(comparison, "gsm8k/exact_match", "quality").verdict is Verdict.IMPROVEMENT  # lm-eval: higher is better
    assert row(comparison, "mmlu/acc", "quality").verdict is Verdict.MISSING
    assert "only in the baseline" in row(comparison, "all", "quality").note
    # identical serving numbers, each side resampled on its own: no regression nor improvement either way
    assert all(
        item.verdict in (Verdict.NO_CHANGE, Verdict.INCONCLUSIVE) and item.delta == 0
        for item in comparison.rows
        if item.kind == "perf"
    )
    assert cli(["compare", str(base), str(new)]) == 1
    assert cli(["compare", str(base), str(new), "--max-regression", "kl=60"]) == 0


def test_bad_input_exits_2(tmp_path):
    run = simple_run(tmp_path / "run", seed=1)
    (tmp_path / "empty").mkdir()
    assert cli(["compare", str(tmp_path / "empty"), str(run)]) == 2
    assert cli(["compare", str(run), str(tmp_path / "nowhere")]) == 2
    assert cli(["compare", str(run), str(run), "--max-regression", "ttft_p50"]) == 2
    assert cli(["compare", str(run), str(run), "--max-regression", "nonsense=5"]) == 2
    assert cli(["compare", str(run), str(run), "--metrics", "ttft_p42"]) == 2
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "summary.json").write_text("{not json")
    assert cli(["compare", str(run), str(tmp_path / "torn")]) == 2


# --- baselines and the nightly script ----------------------------------------------------------------------


def test_baseline_update_copies_the_run_with_provenance(tmp_path):
    run = simple_run(tmp_path / "run", seed=1)
    root = tmp_path / "results" / "baselines"
    (root / "nightly-cpu").mkdir(parents=True)
    (root / "nightly-cpu" / "eval.json").write_text("{}")  # from an older baseline: must not survive
    assert cli(["baseline", "update", str(run), "--name", "nightly-cpu", "--root", str(root)]) == 0
    target = root / "nightly-cpu"
    assert sorted(path.name for path in target.iterdir()) == sorted(
        ["summary.json", "summary.csv", "summary.md", "config.yaml", "env.json", "requests.jsonl", PROVENANCE_JSON]
    )
    provenance = json.loads((target / PROVENANCE_JSON).read_text())
    assert provenance["git_commit"] == "abc123" and provenance["cpu"] == "test cpu"
    assert provenance["command"] == "kvbench run ci/nightly-cpu.yaml"
    assert provenance["run_started"].startswith("2023-11-14") and provenance["missing_files"] == ["eval.json"]
    comparison = compare(read_run_folder(target), read_run_folder(run))
    assert all(
        item.verdict in (Verdict.NO_CHANGE, Verdict.INCONCLUSIVE) and item.delta == 0 for item in comparison.rows
    )
    assert cli(["baseline", "update", str(tmp_path / "nowhere"), "--name", "x", "--root", str(root)]) == 2
    assert cli(["baseline", "update", str(run), "--name", "../escape", "--root", str(root)]) == 2


@pytest.mark.slow
def test_nightly_script_runs_compares_and_exits_with_compares_code(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    fixtures = tmp_path / "fixtures"
    # Quiet runs: with the default noise 200 requests cannot resolve the tolerances, and --strict fails on that.
    good = simple_run(fixtures / "good", seed=1, n=800, noise=0.1)
    slow = simple_run(fixtures / "slow", seed=2, n=800, ttft_factor=1.4, noise=0.1)
    root = tmp_path / "checkout"
    (root / "ci").mkdir(parents=True)
    (root / "ci" / "nightly-cpu.yaml").write_text("engines: [kvengine]\n")
    promote(good, "nightly-cpu", root / "results" / "baselines")
    # A stand-in `kvbench`: `run` copies a prepared folder, everything else is the real command.
    fake = tmp_path / "kvbench"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1" == run ]]; then mkdir -p "$(dirname "$4")" && cp -r "$FAKE_RUN" "$4"; exit 0; fi\n'
        f'exec "{sys.executable}" -c "import sys; sys.path.insert(0, \'{repo}\'); '
        'from tests.verdicts.test_compare import cli; sys.exit(cli(sys.argv[1:]))" "$@"\n'
    )
    fake.chmod(0o755)

    def nightly(run_folder):
        env = {**os.environ, "KVBENCH": str(fake), "KVBENCH_ROOT": str(root), "FAKE_RUN": str(run_folder)}
        env.pop("GITHUB_OUTPUT", None)
        env.pop("GITHUB_STEP_SUMMARY", None)
        return subprocess.run(
            ["bash", str(repo / "ci" / "nightly.sh"), "nightly-cpu"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    passed = nightly(good)
    assert passed.returncode == 0, passed.stderr
    failed = nightly(slow)
    assert failed.returncode == 1, failed.stderr
    runs = sorted((root / "runs").iterdir())
    assert len(runs) == 2 and all((run / "compare.md").exists() for run in runs)
    assert "REGRESSION" in (runs[-1] / "compare.md").read_text()
    assert nightly(good).returncode == 0  # a third run the same day gets its own folder
    assert sorted(path.name for path in (root / "runs").iterdir())[-1].endswith("-3")
    (root / "ci" / "nightly-cpu.yaml").unlink()
    assert nightly(good).returncode == 2


def test_two_small_runs_of_the_same_engine_are_inconclusive_and_strict_fails_on_it(tmp_path, capsys):
    # The case: two 12-request runs, TTFT p50 +77%, interval [-79%, +720%], was "no change", exit 0.
    base = simple_run(tmp_path / "base", seed=21, n=12)
    new = simple_run(tmp_path / "new", seed=22, n=12)
    comparison = compare(read_run_folder(base), read_run_folder(new))
    ttft = row(comparison, "ttft_p50")
    assert ttft.ci_high - ttft.ci_low > 2 * ttft.spec.tolerance
    assert ttft.verdict is Verdict.INCONCLUSIVE
    assert not comparison.regressions and comparison.exit_code() == 0 and comparison.exit_code(strict=True) == 1
    assert cli(["compare", str(base), str(new), "--metrics", "ttft_p50", "--format", "md"]) == 0
    assert "**1 inconclusive**" in capsys.readouterr().out
    assert cli(["compare", str(base), str(new), "--metrics", "ttft_p50", "--strict"]) == 1
    # A gate that allows inconclusive metrics still reports them, and still fails on a config mismatch.
    assert (
        cli(
            [
                "compare",
                str(base),
                str(new),
                "--metrics",
                "ttft_p50",
                "--strict",
                "--allow-inconclusive",
                "--format",
                "md",
            ]
        )
        == 0
    )
    assert "**1 inconclusive**" in capsys.readouterr().out
    other = write_run(
        tmp_path / "other",
        [(entry(make_records(22, n=12)), make_records(22, n=12))],
        config={"seed": 1, "repeat": 1, "stop": {"num_requests": 200}},
    )  # another seed
    assert cli(["compare", str(base), str(other), "--metrics", "ttft_p50", "--strict", "--allow-inconclusive"]) == 1
    csv = cli(["compare", str(base), str(new), "--metrics", "ttft_p50", "--format", "csv"])
    assert csv == 0 and ",inconclusive," in capsys.readouterr().out


def test_a_metric_whose_direction_no_source_declares_is_inconclusive_not_guessed(tmp_path):
    base, new = simple_run(tmp_path / "base", seed=1), simple_run(tmp_path / "new", seed=1)
    (base / "eval.json").write_text(json.dumps({"settings": [{"kv_setting": "fp8", "metrics": {"mystery_loss": 1.0}}]}))
    (new / "eval.json").write_text(json.dumps({"settings": [{"kv_setting": "fp8", "metrics": {"mystery_loss": 2.0}}]}))
    mystery = row(compare(read_run_folder(base), read_run_folder(new)), "mystery_loss", "quality")
    assert mystery.verdict is Verdict.INCONCLUSIVE and "direction unknown" in mystery.note
    # eval.json's recorded direction (from the run's lm-eval) decides when present
    (new / "eval.json").write_text(
        json.dumps(
            {
                "settings": [
                    {"kv_setting": "fp8", "metrics": {"mystery_loss": 2.0}, "higher_is_better": {"mystery_loss": True}}
                ]
            }
        )
    )
    assert (
        row(compare(read_run_folder(base), read_run_folder(new)), "mystery_loss", "quality").verdict
        is Verdict.IMPROVEMENT
    )


def test_one_endpoint_on_two_ports_measures_the_same_thing_another_path_does_not(tmp_path):
    from dataclasses import replace

    def folder(name, seed, url):
        records = make_records(seed)
        return read_run_folder(
            write_run(tmp_path / name, [(replace(entry(records), engine_settings={"url": url}), records)])
        )

    base = folder("base", 1, "http://127.0.0.1:8101")
    moved = compare(base, folder("moved", 2, "http://127.0.0.1:8102/"))
    assert not moved.mismatched
    assert any("the endpoint moved: http://127.0.0.1:8101 -> http://127.0.0.1:8102/" in note for note in moved.notes)
    other_api = compare(base, folder("proxy", 3, "http://127.0.0.1:8101/proxy"))
    assert other_api.mismatched and any("url: '' -> '/proxy'" in text for text in other_api.mismatches)


def closed_loop_records(seed, n=100, concurrency=4, itl_ms=10.0, run_id=RUN_ID.format(0)):
    """A closed loop of `concurrency` slots: each request starts when its slot's previous one ends (TTFT 40 ms
    lognormal, `itl_ms` per gap with jitter, 10-40 tokens), as `kvbench run --concurrency` drives an instrument."""
    rng = np.random.default_rng(seed)
    free_at = [0] * concurrency
    records = []
    for i in range(n):
        slot = int(np.argmin(free_at))
        start = free_at[slot] + int(rng.exponential(0.5) * MS)  # the client's own gap before the next send
        time_ns = start + int(rng.lognormal(np.log(40), 0.1) * MS)
        chunks = [[time_ns, 1]]
        for gap in rng.lognormal(np.log(itl_ms), 0.1, int(rng.integers(10, 40)) - 1):
            time_ns += int(gap * MS)
            chunks.append([time_ns, 1])
        free_at[slot] = time_ns
        records.append(
            RequestRecord(
                run_id=run_id,
                request_id=f"q{i}",
                session_id=f"s{i}",
                tenant="a",
                turn=0,
                queued_ns=start,
                sent_ns=start,
                first_token_ns=chunks[0][0],
                done_ns=time_ns,
                chunks=chunks,
                prompt_tokens=100,
                output_tokens=len(chunks),
                cached_tokens=0,
                reusable_tokens=0,
            )
        )
    return records


def closed_run(path, seed, **kwargs):
    records = closed_loop_records(seed, **kwargs)
    return read_run_folder(write_run(path, [(entry(records, load="conc=4"), records)]))


def test_closed_loop_throughput_interval_shrinks_with_the_data_and_sees_a_doubled_itl(tmp_path):
    records = closed_loop_records(1)
    overall = summarize_run(records).to_dict()["overall"]
    samples = RequestSamples.of(records, closed_loop=True)
    identity = np.ones((1, samples.size), dtype=np.int32)
    for name in ("output_tok_s", "total_tok_s", "req_s"):  # Little's law reproduces the stored value
        assert PERF_METRICS[name].statistic(samples, identity)[0] == pytest.approx(PERF_METRICS[name].stored(overall))
    options = CompareOptions(metrics=("output_tok_s", "itl_p50", "tpot_p50", "e2e_p50"))
    widths = {}
    for n in (100, 400):
        same = row(
            compare(closed_run(tmp_path / f"a{n}", 1, n=n), closed_run(tmp_path / f"b{n}", 2, n=n), options),
            "output_tok_s",
        )
        assert same.verdict is not Verdict.REGRESSION and same.ci_low < 0 < same.ci_high
        widths[n] = same.ci_high - same.ci_low
    assert widths[400] < 0.7 * widths[100] and widths[100] < 0.25  # the span-based interval was ~[-56%, +129%]
    slow = compare(closed_run(tmp_path / "a", 1), closed_run(tmp_path / "slow", 2, itl_ms=20.0), options)
    for metric in ("output_tok_s", "itl_p50", "tpot_p50", "e2e_p50"):
        assert row(slow, metric).verdict is Verdict.REGRESSION, metric
        assert row(slow, metric).mde is not None and row(slow, metric).mde >= row(slow, metric).spec.tolerance
