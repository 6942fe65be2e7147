"""The GPU nightly as a matrix of jobs that each fit: every cell of ci/nightly-gpu.yaml is one job of
ci/github-nightly.yml, each cell's planned load fits the job's budget (less than its timeout), the whole plan does
not fit one job, `--budget` refuses a plan over it (exit 2, one line) and the dry run prints each cell's expected
duration and the total; `--cell` picks cells; ci/gpu-nightly-env.sh sets each engine's interpreter from the
documented venv layout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kvbench.cli.main import main
from kvbench.harness.config import load_config_file
from kvbench.harness.dry_run import budget_problem, format_plan, plan_experiment

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / "ci" / "github-nightly.yml").read_text())
GPU_JOB = WORKFLOW["jobs"]["gpu"]
MATRIX = GPU_JOB["strategy"]["matrix"]["include"]


@pytest.fixture(scope="module")
def gpu_plan(tmp_path_factory):
    saved = {key: os.environ.pop(key, None) for key in ("KVBENCH_VLLM_PYTHON", "KVBENCH_SGLANG_PYTHON")}
    try:  # no engine installed here: the committed help texts are checked
        return plan_experiment(load_config_file(ROOT / "ci" / "nightly-gpu.yaml"), tmp_path_factory.mktemp("dry"))
    finally:
        os.environ.update({key: value for key, value in saved.items() if value is not None})


def test_every_cell_is_one_job_and_fits_its_budget_while_the_whole_plan_would_not(gpu_plan):
    budget = float(GPU_JOB["env"]["BUDGET_MINUTES"])
    assert budget < GPU_JOB["timeout-minutes"]
    assert sorted(item["cell"] for item in MATRIX) == sorted(cell.label for cell in gpu_plan)
    assert len({item["baseline"] for item in MATRIX}) == len(MATRIX)  # each cell its own baseline
    for cell in gpu_plan:
        assert 60 < cell.expected_s / 60 <= budget, cell.label
        assert budget_problem([cell], budget) is None
    problem = budget_problem(gpu_plan, GPU_JOB["timeout-minutes"])
    assert problem.startswith(f"--budget {GPU_JOB['timeout-minutes']}: the plan needs at least ~")
    assert "over 10 cells" in problem


def test_the_dry_run_prints_each_cells_duration_and_the_total(gpu_plan):
    text = format_plan(gpu_plan).split("== expected duration per cell (10 cells) ==")[1].splitlines()
    total = sum(cell.expected_s for cell in gpu_plan) / 60
    assert [line.split()[0] for line in text[1:11]] == [cell.label for cell in gpu_plan]
    assert text[11].split()[:4] == ["total", "at", "least", f"~{total:.0f}"]


def _small(tmp_path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engines": [
                    {
                        "engine": "endpoint",
                        "label": "e",
                        "settings": {"url": "http://127.0.0.1:9"},
                        "sweep": {"model": ["a", "b"]},
                    }
                ],
                "workloads": [{"name": "rag-chat-mini", "num_sessions": 4}],
                "loads": [{"rate": 1.0}],
                "stop": {"duration_s": 600},
                "repeat": 2,
            }
        )
    )
    return path


def test_budget_refuses_a_plan_over_it_and_cell_picks_cells(tmp_path, capsys):
    config = _small(tmp_path)  # 2 cells x 2 repetitions of ~20 s of sends
    assert main(["run", str(config), "--dry-run", "--budget", "0.1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --budget 0.1: the plan needs at least ~")
    assert (
        main(
            ["run", str(config), "--dry-run", "--budget", "1000", "--cell", "e[model=a]", "--out", str(tmp_path / "o")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "(1 cells)" in out and "e[model=a]" in out and "e[model=b]" not in out
    assert main(["run", str(config), "--budget", "0.1", "--out", str(tmp_path / "o")]) == 2  # refused before launching
    assert not (tmp_path / "o").exists()
    assert main(["run", str(config), "--dry-run", "--cell", "nope"]) == 2
    assert "no such cell; its cells: e[model=a], e[model=b]" in capsys.readouterr().err


def _env(tmp_path, **values):
    env = {**os.environ, "ENGINE_VENVS": str(tmp_path), "MODEL_PATH": "/m/Q", "NVME_PATH": "/nv", **values}
    return subprocess.run(["bash", str(ROOT / "ci" / "gpu-nightly-env.sh")], env=env, capture_output=True, text=True)


def test_the_cells_interpreters_come_from_the_venv_layout(tmp_path):
    for path in ("vllm/bin/python", "sglang/bin/python", "trtllm/bin/trtllm-serve"):
        (tmp_path / path).parent.mkdir(parents=True)
        (tmp_path / path).write_text("#!/bin/sh\n")
        (tmp_path / path).chmod(0o755)
    assert {item["venv"] for item in MATRIX} == {"vllm", "lmcache", "sglang", "trtllm", ""}
    lines = {
        venv: _env(tmp_path, ENGINE_VENV=venv).stdout.splitlines()
        for venv in ("vllm", "lmcache", "sglang", "trtllm", "")
    }
    assert lines["vllm"] == [f"KVBENCH_VLLM_PYTHON={tmp_path}/vllm/bin/python", "CELL_SETS=--set model=/m/Q"]
    assert lines["lmcache"] == [
        f"KVBENCH_VLLM_PYTHON={tmp_path}/vllm/bin/python",
        "CELL_SETS=--set model=/m/Q --set local_disk_path=/nv/kvbench-lmcache",
    ]
    assert lines["sglang"][0] == f"KVBENCH_SGLANG_PYTHON={tmp_path}/sglang/bin/python"
    assert lines["trtllm"] == [f"CELL_SETS=--set model=/m/Q --set executable={tmp_path}/trtllm/bin/trtllm-serve"]
    assert lines[""] == ["CELL_SETS=--set model=/m/Q"]
    (tmp_path / "sglang/bin/python").unlink()
    missing = _env(tmp_path, ENGINE_VENV="sglang")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1 and "sglang/bin/python" in missing.stderr
    assert _env(tmp_path, ENGINE_VENV="vllm", MODEL_PATH="/a b").returncode == 2
