"""`kvbench run CONFIG.yaml` with flags: a load flag replaces the config's load points (as --num-requests its
stop), and a flag naming another engine or workload is refused in one line, never silently dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.cli.commands.run_cmd import config_from_args
from kvbench.cli.main import build_parser, main
from kvbench.harness.config import load_config_file
from kvbench.settings import SettingsError

CONFIG = Path(__file__).resolve().parents[2] / "ci" / "nightly-cpu.yaml"


def _config(*flags):
    return config_from_args(build_parser().parse_args(["run", str(CONFIG), *flags]))


def test_without_load_flags_the_config_keeps_its_own_load_points():
    assert _config().loads == load_config_file(CONFIG).loads


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--concurrency", "3"], {"concurrency": 3}),
        (["--request-rate", "2.5", "--max-concurrency", "4"], {"request_rate": 2.5, "max_concurrency": 4}),
        (["--rate", "0.5"], {"rate": 0.5}),
    ],
)
def test_a_load_flag_replaces_the_configs_load_points(flags, expected):
    (load,) = _config(*flags).load_specs()
    for key, value in expected.items():
        assert getattr(load, key) == value
    assert _config().loads != _config(*flags).loads


def test_num_sessions_applies_to_every_workload_of_the_config():
    assert {workload.num_sessions for workload in _config("--num-sessions", "3").workloads} == {3}


@pytest.mark.parametrize(
    "flags",
    [
        ["--engine", "vllm"],
        ["--url", "http://127.0.0.1:1"],
        ["--model", "m"],
        ["--workload", "random"],
        ["--api-key", "k"],
    ],
)
def test_a_flag_naming_another_engine_or_workload_is_refused(flags):
    with pytest.raises(SettingsError, match=flags[0]):
        _config(*flags)


def test_the_refusal_is_one_line_and_exit_2(capsys):
    assert main(["run", str(CONFIG), "--workload", "random", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--workload" in err and "Traceback" not in err


def test_url_model_and_api_key_set_the_configs_endpoint_cells_and_leave_the_others(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(
        "name: m\nengines:\n  - {engine: endpoint, label: remote, settings: {url: 'http://old:1', model: a}}\n"
        "  - {engine: kvengine, label: ours, settings: {kv_capacity: 512}}\n"
        "workloads: [{name: rag-chat-mini}]\nloads: [{concurrency: 2}]\n"
    )
    flags = ["--url", "http://127.0.0.1:8101", "--model", "served", "--api-key", "k"]
    config = config_from_args(build_parser().parse_args(["run", str(path), *flags]))
    remote, ours = config.engines
    assert (remote.settings["url"], remote.settings["model"], remote.settings["api_key"]) == (
        "http://127.0.0.1:8101",
        "served",
        "k",
    )
    assert "url" not in ours.settings and "model" not in ours.settings
    assert config_from_args(build_parser().parse_args(["run", str(path)])).engines[0].settings["url"] == "http://old:1"
