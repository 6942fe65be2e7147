"""The bad-input corpus (tests/data/bad_inputs): every bad config, trace, workload file, tenants file and command
line gets exit 2 and one line on stderr that names the field, before any engine starts; never a traceback.

Each folder's `expect.yaml` maps a file to the text its message must contain; `flags.yaml` lists command lines.
An engine that would start is a failure: `ManagedProcess.start` raises inside these tests (every adapter
launches its server through it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kvbench.cli.main import main
from kvbench.engines.process import ManagedProcess

from ..paths import REPO

CORPUS = REPO / "tests" / "data" / "bad_inputs"


def _expectations(folder: str) -> list[tuple[str, str]]:
    expect = yaml.safe_load((CORPUS / folder / "expect.yaml").read_text())
    files = sorted(path.name for path in (CORPUS / folder).iterdir() if path.name != "expect.yaml")
    assert sorted(expect) == files, f"{folder}/expect.yaml must name every file of the folder, and only those"
    return sorted(expect.items())


@pytest.fixture
def no_engine(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"an engine process would have started: {args[0].command}")

    monkeypatch.setattr(ManagedProcess, "start", refuse)


def _refused(argv: list[str], capsys) -> str:
    """Run `kvbench ARGV` in-process; assert exit 2 with one stderr line; return that line."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2, f"exit {code} for {argv}: {err}"
    assert len(err.splitlines()) == 1, f"expected one line for {argv}, got:\n{err}"
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(("name", "expect"), _expectations("configs"))
def test_bad_config_is_refused_with_its_field(name, expect, tmp_path, capsys, no_engine):
    line = _refused(["run", str(CORPUS / "configs" / name), "--out", str(tmp_path / "run")], capsys)
    assert expect in line
    assert not (tmp_path / "run" / "requests.jsonl").exists()


@pytest.mark.parametrize(("name", "expect"), _expectations("traces"))
@pytest.mark.parametrize("command", [["trace", "stats"], ["workload"]])
def test_bad_trace_is_refused_with_its_line_and_field(name, expect, command, capsys):
    argv = [*command, str(CORPUS / "traces" / name)] + (["--stats"] if command == ["workload"] else [])
    assert expect in _refused(argv, capsys)


@pytest.mark.parametrize(("name", "expect"), _expectations("traces"))
def test_bad_trace_as_run_workload_is_refused_before_the_engine(name, expect, tmp_path, capsys, no_engine):
    line = _refused(["run", "--workload", str(CORPUS / "traces" / name), "--out", str(tmp_path / "run")], capsys)
    assert expect in line


@pytest.mark.parametrize(("name", "expect"), _expectations("workloads"))
def test_bad_workload_parameters_are_refused_with_their_field(name, expect, capsys):
    assert expect in _refused(["workload", str(CORPUS / "workloads" / name), "--stats"], capsys)


@pytest.mark.parametrize("case", yaml.safe_load((CORPUS / "flags.yaml").read_text()), ids=lambda c: " ".join(c["argv"]))
def test_bad_flag_is_refused_before_anything_starts(case, tmp_path, monkeypatch, capsys, no_engine):
    monkeypatch.chdir(tmp_path)  # where `kvbench run` would make runs/<name>-<time>/
    argv = [arg.replace("{repo}", str(REPO)) for arg in case["argv"]]
    assert case["expect"] in _refused(argv, capsys)
    assert list(tmp_path.iterdir()) == [], "nothing is written for a refused command line"


@pytest.mark.parametrize(("name", "expect"), _expectations("tenants"))
def test_bad_tenants_file_is_refused_by_the_simulator_and_by_run(name, expect, tmp_path, capsys, no_engine):
    tenants = str(CORPUS / "tenants" / name)
    argv = [
        "simulate",
        "--workload",
        "rag-chat-mt-mini",
        "--num-sessions",
        "2",
        "--tenants-file",
        tenants,
        "--out",
        str(tmp_path / "sim"),
    ]
    assert expect in _refused(argv, capsys)
    argv = ["run", "--set", "model=tiny-random", "--set", f"tenants_file={tenants}", "--out", str(tmp_path / "run")]
    assert expect in _refused(argv, capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_real_process_prints_one_line_and_exits_2(tmp_path):
    """The same contract outside pytest's capture: a real `kvbench` process, its real stderr."""
    for argv in (
        ["run", str(CORPUS / "configs" / "tenant_api_keys_string.yaml"), "--out", str(tmp_path / "r")],
        ["trace", "stats", str(CORPUS / "traces" / "binary.jsonl")],
        ["run", "--num-requests", "0"],
    ):
        done = subprocess.run([sys.executable, "-m", "kvbench.cli", *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
