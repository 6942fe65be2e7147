"""Every experiment config shipped under ci/ parses, and every engine setting in it is one its adapter knows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvbench.engines.registry import engine_factory
from kvbench.evals.runner import load_eval_config
from kvbench.harness.config import load_config_file

CI = Path(__file__).resolve().parents[2] / "ci"
RUN_CONFIGS = sorted(
    path for path in CI.glob("*.yaml") if not path.stem.endswith("-eval") and path.stem != "github-nightly"
)
EVAL_CONFIGS = sorted(CI.glob("*-eval.yaml"))


def test_there_are_configs_to_check():
    assert {path.stem for path in RUN_CONFIGS} >= {"nightly-cpu", "nightly-gpu", "seed-table"}


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda path: path.stem)
def test_run_config_parses_and_its_engine_settings_are_known(path, tmp_path):
    config = load_config_file(path)
    for engine in config.engines:
        adapter = engine_factory(engine.engine)(engine.settings, tmp_path / engine.label)
        assert adapter.describe()["kv_dtype"]


@pytest.mark.parametrize("path", EVAL_CONFIGS, ids=lambda path: path.stem)
def test_eval_config_parses(path):
    assert load_eval_config(yaml.safe_load(path.read_text()), str(path)).kv_dtypes
