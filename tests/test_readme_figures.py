"""The README's figures for the nightly jobs are the configs' own: the GPU matrix's cells, loads, repeats and
minutes as `kvbench run ci/nightly-gpu.yaml --dry-run` plans them, and the GPU job's timeout and budget as
ci/github-nightly.yml sets them. A figure that goes stale (a longer load, another timeout) fails here."""

from __future__ import annotations

import re

import pytest
import yaml

from kvbench.harness.config import load_config_file
from kvbench.harness.dry_run import plan_experiment

from .paths import REPO

README = (REPO / "README.md").read_text()
SENTENCE = re.compile(
    r"`kvbench run ci/nightly-gpu\.yaml`: (?P<cells>\d+) cells x (?P<loads>\d+) loads x (?P<repeat>\d+) repeats of "
    r"(?P<minutes>\d+) min, ~(?P<cell_min>\d+) min of load a\s+cell and ~(?P<total_min>\d+) min in all by the dry "
    r"run's figures\); `ci/github-nightly\.yml` runs it as one GPU job per cell, each\s+with a (?P<timeout>\d+)-minute "
    r"timeout and `--budget (?P<budget>\d+)`"
)


@pytest.fixture(scope="module")
def figures() -> dict[str, int]:
    match = SENTENCE.search(README)
    assert match, "the README's sentence on the GPU nightly's size is gone or reworded; update SENTENCE with it"
    return {key: int(value) for key, value in match.groupdict().items()}


def test_the_gpu_matrix_figures_are_its_dry_runs(figures, tmp_path):
    config = load_config_file(REPO / "ci" / "nightly-gpu.yaml")
    cells = plan_experiment(config, tmp_path, use_installed=False)
    assert (figures["cells"], figures["loads"], figures["repeat"]) == (len(cells), len(config.loads), config.repeat)
    assert figures["minutes"] * 60 == config.stop.duration_s
    longest = max(cell.expected_s for cell in cells) / 60
    assert round(longest) == figures["cell_min"]
    assert round(sum(cell.expected_s for cell in cells) / 60, -1) == figures["total_min"]


def test_the_gpu_jobs_timeout_and_budget_are_the_workflows(figures):
    gpu = yaml.safe_load((REPO / "ci" / "github-nightly.yml").read_text())["jobs"]["gpu"]
    assert gpu["timeout-minutes"] == figures["timeout"]
    assert int(gpu["env"]["BUDGET_MINUTES"]) == figures["budget"]
    assert len(gpu["strategy"]["matrix"]["include"]) == figures["cells"]  # one job per cell
    assert figures["cell_min"] <= figures["budget"] < figures["timeout"]  # each cell fits its job
