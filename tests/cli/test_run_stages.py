"""`kvbench run --stages ... --warmup-stage ...` against the instrument with a prefix cache of its own (a real server
over HTTP): a row per measured stage, the warm-up recorded but in no row, each stage drained before the next, one
cache reset before the ladder and none between its stages; the flags that would set another load are refused."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from kvbench.cli.main import main
from kvbench.harness import stage_play
from kvbench.measure.records import read_records

from ..engines.test_endpoint_cache_reset import PrefixCache, cache_server
from ..harness.instrument_fixture import free_port

# 8 prompts of a 64-token system prompt (2 groups) and a 16-token question, 4 tokens out: quick on the instrument,
# and a later stage's prompts were all sent by the stages before it.
SMALL_SHARED_PREFIX = {
    "generator": "shared_prefix",
    "num_groups": 2,
    "num_prompts_per_group": 4,
    "system_prompt_len": 64,
    "question_len": 16,
    "output_len": 4,
}
LABELS = ["20/s x 0.5 s", "40/s x 0.5 s"]
NOT_ABOUT_LAG = ("--max-lag-ms", "1000")  # the server shares this process: the client's lag is not the subject


def _workload(tmp_path) -> str:
    path = tmp_path / "shared-prefix-small.yaml"
    path.write_text(yaml.safe_dump(SMALL_SHARED_PREFIX))
    return str(path)


def test_each_stage_is_a_row_after_a_warmup_left_out_on_one_warm_server(tmp_path, capsys, monkeypatch):
    cache, out, pauses = PrefixCache(), tmp_path / "run", []
    monkeypatch.setattr(stage_play, "time", SimpleNamespace(sleep=lambda s: (pauses.append(s), time.sleep(s))))
    with cache_server(cache, "vllm") as url:
        code = main(
            [
                "run",
                "--url",
                url,
                "--set",
                "metrics_path=null",
                "--workload",
                _workload(tmp_path),
                "--stages",
                "20:0.5,40:0.5",
                "--warmup-stage",
                "20:0.5",
                *NOT_ABOUT_LAG,
                "--out",
                str(out),
            ]
        )
    console = capsys.readouterr().out
    assert code == 0, console
    assert cache.resets == 1  # before the ladder, none between its stages
    assert pauses == [1.0, 1.0]  # the gap after the warm-up's drain and after the first stage's

    entries = json.loads((out / "summary.json").read_text())["runs"]
    assert [entry["load"] for entry in entries] == LABELS
    overall = [entry["summary"]["overall"] for entry in entries]
    assert [summary["requests"] for summary in overall] == [10, 20]  # the warm-up's 10 in neither
    assert [entry["cache_reset"] for entry in entries] == [True, False]
    assert all(entry["valid"] for entry in entries), [entry["invalid_reasons"] for entry in entries]
    later = overall[1]["cache"]
    # The server kept the cache of the stages before (every prompt already sent), and the oracle counts them too.
    assert later["cache_hit_rate"] > 0.9 and later["cache_hit_rate"] <= later["oracle_hit_rate"] + 1e-9

    records = list(read_records(out / "requests.jsonl"))
    first, second = (entry["run_id"] for entry in entries)
    warmup = [r for r in records if r.warmup]
    stage0 = [r for r in records if r.run_id == first and not r.warmup]
    stage1 = [r for r in records if r.run_id == second]
    assert len(records) == 40 and len(warmup) == 10 and {r.run_id for r in warmup} == {first}
    assert (len(stage0), len(stage1)) == (10, 20) and not any(r.warmup for r in stage1)
    # Stage s takes the next sessions of the workload, in its order.
    sessions = [set(r.session_id for r in part) for part in (warmup, stage0, stage1)]
    assert sum(map(len, sessions)) == 40 and len(set.union(*sessions)) == 40
    # Each part is drained before the next is sent (order of the client's own clock, not durations).
    for before, after in ((warmup, stage0), (stage0, stage1)):
        assert max(r.done_ns for r in before) < min(r.planned_ns for r in after)
    # Arrivals are the stage's Poisson schedule: the first at the stage's start, none before the one before it.
    for part in (warmup, stage0, stage1):
        planned = sorted(r.planned_ns for r in part)
        assert planned == sorted(planned) and len(set(planned)) == len(planned)

    frame = pd.read_csv(out / "summary.csv")
    rows = frame[frame.tenant == "all"]
    assert list(rows.load) == LABELS and list(rows.requests) == [10, 20]
    summary_md = (out / "summary.md").read_text()
    assert all(label in summary_md for label in LABELS)
    assert all(label in console for label in LABELS)


def test_a_config_load_point_of_stages_runs_the_same_ladder(tmp_path):
    cache, out = PrefixCache(), tmp_path / "run"
    with cache_server(cache, "vllm") as url:
        config = tmp_path / "stages.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "engines": [{"engine": "endpoint", "settings": {"url": url, "metrics_path": None}}],
                    "workloads": [{"name": _workload(tmp_path), "num_sessions": 30}],
                    "loads": [{"stages": "20:0.5,40:0.5"}],
                    "repeat": 2,
                    "client": {"max_lag_ms": 1000},
                }
            )
        )
        assert main(["run", str(config), "--out", str(out)]) == 0
    entries = json.loads((out / "summary.json").read_text())["runs"]
    # A repetition is the whole ladder: its first stage after a reset, the second on the cache it left.
    assert [(entry["load"], entry["repeat"], entry["cache_reset"]) for entry in entries] == [
        (LABELS[0], 0, True),
        (LABELS[1], 0, False),
        (LABELS[0], 1, True),
        (LABELS[1], 1, False),
    ]
    assert [entry["summary"]["overall"]["requests"] for entry in entries] == [10, 20, 10, 20]
    assert cache.resets == 2 and not any(r.warmup for r in read_records(out / "requests.jsonl"))
    assert yaml.safe_load((out / "config.yaml").read_text())["loads"] == [
        {
            "rate": None,
            "concurrency": None,
            "burstiness": 1.0,
            "request_rate": None,
            "max_concurrency": None,
            "stages": "20:0.5,40:0.5",
            "warmup_stage": None,
        }
    ]


def test_a_config_with_fewer_sessions_than_its_stages_send_is_refused_before_the_run(tmp_path, capsys):
    config = tmp_path / "short.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [{"engine": "endpoint", "settings": {"url": f"http://127.0.0.1:{free_port()}"}}],
                "workloads": [{"name": _workload(tmp_path), "num_sessions": 12}],
                "loads": [{"stages": "20:0.5,40:0.5"}],
            }
        )
    )
    assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 2
    assert "the stages send 30 requests but the workload has 12 sessions" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--rate", "2"], "--rate"),
        (["--request-rate", "2"], "--request-rate"),
        (["--concurrency", "2"], "--concurrency"),
        (["--max-concurrency", "2"], "--max-concurrency"),
        (["--num-requests", "5"], "--num-requests"),
        (["--warmup", "5"], "--warmup"),
        (["--workers", "2"], "--workers"),
    ],
)
def test_a_flag_that_sets_another_load_is_refused_with_stages(tmp_path, capsys, flags, named):
    argv = ["run", "--url", f"http://127.0.0.1:{free_port()}", "--stages", "2:1", *flags, "--out", str(tmp_path / "x")]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's mutually exclusive load flags
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and named in err and "--stages" in err, err


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--warmup-stage", "2:1"], "--warmup-stage needs --stages"),
        (["--stages", "2"], "is not RATE:SECONDS"),
        (["--stages", "2:1", "--warmup-stage", "0:1"], "must both be > 0"),
    ],
)
def test_a_bad_or_lone_stage_flag_is_refused_naming_it(tmp_path, capsys, flags, says):
    try:
        code = main(["run", "--url", f"http://127.0.0.1:{free_port()}", *flags, "--out", str(tmp_path / "x")])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err


def test_stages_replace_a_configs_load_points_and_reach_the_simulator(tmp_path, capsys):
    config = tmp_path / "conc.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [{"engine": "endpoint", "settings": {"url": f"http://127.0.0.1:{free_port()}"}}],
                "workloads": [{"name": _workload(tmp_path), "num_sessions": 8}],
                "loads": [{"concurrency": 2}],
            }
        )
    )
    assert main(["run", str(config), "--stages", "2:1,4:1", "--dry-run", "--out", str(tmp_path / "dry")]) == 0
    plan = capsys.readouterr().out
    assert "stage 2/s x 1 s" in plan and "stage 4/s x 1 s" in plan and "concurrency 2" not in plan
    out = tmp_path / "sim"
    assert (
        main(
            [
                "run",
                "--engine",
                "sim",
                "--sim-preset",
                "vllm-prefix",
                "--workload",
                "shared-prefix",
                "--stages",
                "2:2",
                "--warmup-stage",
                "2:1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    [entry] = json.loads((out / "summary.json").read_text())["runs"]
    assert entry["summary"]["overall"]["requests"] == 4  # the simulator's stage, its warm-up left out
