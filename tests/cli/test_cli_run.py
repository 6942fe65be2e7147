"""`kvbench run` end to end: our engine as a real process, the instrument server, and bad input."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvbench.cli.main import main
from kvbench.engines.process import PID_LINE
from kvbench.measure.records import read_records
from kvbench.measure.report import COLUMNS
from kvbench.workloads.profiles import load_workload

from ..harness.instrument_fixture import free_port, instrument_process
from ..quick_workload import quick_mini

# A run whose exit code a test reads but whose subject is not the client's own lag: a loaded test machine can
# push the event loop's p99 past the 10 ms default, which makes a point invalid (exit 1).
NOT_ABOUT_LAG = ("--max-lag-ms", "1000")
# Where the workload's timing is not the subject either: rag-chat-mini with 20x shorter think times.


def _wait_for_records(out, driver, count, timeout_s=120):
    """Until `out/requests.jsonl` holds `count` records (bounded; the driver must still be running)."""
    deadline = time.monotonic() + timeout_s
    path = out / "requests.jsonl"
    while not (path.exists() and len(list(read_records(path))) >= count):
        assert driver.poll() is None, f"kvbench run exited early with code {driver.returncode}"
        assert time.monotonic() < deadline, "no records in time"
        time.sleep(0.2)


@pytest.mark.slow
def test_run_on_our_engine_writes_every_result_file(tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--set",
            "model=tiny-random",
            "--set",
            "kv_capacity=4096",
            "--num-sessions",
            "4",
            "--concurrency",
            "2",
            "--workload",
            quick_mini(tmp_path),
            *NOT_ABOUT_LAG,
            "--out",
            str(out),
        ]
    )
    assert code == 0
    for name in (
        "config.yaml",
        "env.json",
        "requests.jsonl",
        "summary.json",
        "summary.csv",
        "summary.md",
        "ttft_cdf.png",
        "throughput_vs_ttft_p99.png",
        "engines/kvengine/engine.log",
    ):
        assert (out / name).exists(), name
    frame = pd.read_csv(out / "summary.csv")
    assert list(frame.columns[: len(COLUMNS)]) == COLUMNS
    row = frame[frame.tenant == "all"].iloc[0]
    records = list(read_records(out / "requests.jsonl"))
    assert row.requests == len(records) and row.errors == 0
    assert 0 < row.cache_hit_rate <= row.oracle_hit_rate + 1e-9  # later turns reuse earlier ones
    entry = json.loads((out / "summary.json").read_text())["runs"][0]
    assert entry["reconciliation"]["agree"] is True
    assert entry["answer_sources"] == {"token_ids": len(records)}
    assert entry["cache_reset"] is True


@pytest.mark.slow
def test_unreachable_url_fails_before_load_with_exit_2(tmp_path, capsys):
    code = main(["run", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "x")])
    assert code == 2
    assert "cannot reach" in capsys.readouterr().err
    assert not (tmp_path / "x" / "requests.jsonl").exists() or not (tmp_path / "x" / "requests.jsonl").read_text()


def test_unknown_workload_engine_and_yaml_key_are_named_with_choices(tmp_path, capsys):
    assert (
        main(["run", "--workload", "rag-chat-maxi", "--url", "http://127.0.0.1:1", "--out", str(tmp_path / "n")]) == 2
    )
    assert "rag-chat-mini" in capsys.readouterr().err
    assert main(["run", "--engine", "vllm-turbo", "--out", str(tmp_path / "n")]) == 2
    assert "kvengine" in capsys.readouterr().err
    config = tmp_path / "bad.yaml"
    config.write_text("engines: [{engine: endpoint}]\nloads: [{rate: 1, concurency: 3}]\n")
    assert main(["run", str(config), "--out", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err
    assert "concurency" in err and "concurrency" in err
    assert not (tmp_path / "n").exists()  # nothing started, nothing written


def test_engine_killed_mid_run_keeps_finished_records_and_fails_clearly(tmp_path, capsys):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvbench.harness.instrument",
            "--port",
            str(port),
            "--first-token-ms",
            "30",
            "--chunk-interval-ms",
            "10",
        ]
    )
    try:
        deadline = time.monotonic() + 20
        from kvbench.engines.http import request

        while not request("GET", f"http://127.0.0.1:{port}/health", timeout_s=1).ok:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        out = tmp_path / "run"
        # The kill comes once a request has finished and been written (not after a fixed time: on a loaded
        # machine the run may not have finished one in any given number of seconds).
        killer = threading.Thread(target=_kill_after_a_finished_record, args=(server, out / "requests.jsonl"))
        killer.start()
        code = main(
            [
                "run",
                "--url",
                f"http://127.0.0.1:{port}",
                "--workload",
                "rag-chat-mini",
                "--concurrency",
                "2",
                "--out",
                str(out),
            ]
        )
        killer.join()
    finally:
        server.kill()
        server.wait()
    assert code == 1
    records = list(read_records(out / "requests.jsonl"))
    finished = [r for r in records if r.ok]
    assert finished, "requests finished before the kill must be on disk"
    assert any(r.error and r.error.startswith("connection") for r in records)
    assert "engine unreachable" in (out / "summary.md").read_text()
    assert "failed" in capsys.readouterr().out


def _kill_after_a_finished_record(server: subprocess.Popen, records: Path, deadline_s: float = 120.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):  # not written yet, or a line being written
            if any(r.ok for r in read_records(records)):
                break
        time.sleep(0.05)
    server.kill()


def _entries(out):
    return json.loads((out / "summary.json").read_text())["runs"]


def test_a_run_where_every_request_fails_is_invalid_and_fails(tmp_path, capsys):
    # (a wrong --model no longer gets this far: the preflight refuses it, tests/harness/test_preflight.py)
    with instrument_process("--fault", "http_500") as (url, _):
        out = tmp_path / "run"
        code = main(["run", "--url", url, "--num-sessions", "3", *NOT_ABOUT_LAG, "--out", str(out)])
    assert code == 1
    (entry,) = _entries(out)
    assert entry["valid"] is False
    (reason,) = entry["invalid_reasons"]
    assert reason.startswith("3/3 requests failed (limit 10%): http: 500")
    assert "INVALID: 3/3 requests failed" in (out / "summary.md").read_text()
    row = pd.read_csv(out / "summary.csv").iloc[0]
    assert not row.valid and row.invalid_reasons == entry["invalid_reasons"][0]
    assert "3/3 requests failed" in capsys.readouterr().out


@pytest.mark.slow
def test_a_hung_server_is_detected_and_the_run_stops(tmp_path):
    config = tmp_path / "hang.yaml"
    out = tmp_path / "run"
    with instrument_process("--first-token-ms", "30", "--chunk-interval-ms", "10") as (url, server):
        config.write_text(
            f"engines: [{{engine: endpoint, settings: {{url: '{url}'}}}}]\n"
            "workloads: [{name: rag-chat-mini, num_sessions: 50}]\n"
            "loads: [{concurrency: 2}]\nstop: {num_requests: 1000}\n"
            "client: {header_timeout_s: 1, first_byte_timeout_s: 1, stall_timeout_s: 1}\n"
        )
        driver = subprocess.Popen(
            [sys.executable, "-m", "kvbench.cli", "run", str(config), "--out", str(out)], stdout=subprocess.DEVNULL
        )
        try:
            _wait_for_records(out, driver, 1)
            os.kill(server.pid, signal.SIGSTOP)
            code = driver.wait(timeout=90)  # without detection it would wait request_timeout_s (600 s)
        finally:
            driver.kill()
    assert code == 1
    (entry,) = _entries(out)
    assert entry["aborted"].startswith("engine unreachable: 3 requests in a row got no answer")
    unanswered = [r for r in read_records(out / "requests.jsonl") if r.error_kind in ("timeout", "stalled")]
    assert len(unanswered) >= 3


@pytest.mark.parametrize("body", ["{}", "<!DOCTYPE html><html><body>Bad gateway</body></html>"])
@pytest.mark.slow
def test_metrics_that_are_not_prometheus_text_do_not_stop_the_run(tmp_path, body):
    with instrument_process("--metrics-body", body) as (url, _):
        out = tmp_path / "run"
        code = main(
            [
                "run",
                "--url",
                url,
                "--num-sessions",
                "2",
                "--workload",
                quick_mini(tmp_path),
                *NOT_ABOUT_LAG,
                "--out",
                str(out),
            ]
        )
    assert code == 0
    (entry,) = _entries(out)
    assert entry["summary"]["overall"]["completed"] == entry["summary"]["overall"]["requests"] > 0
    assert entry["server_counters"] is None and entry["reconciliation"]["server_cached_tokens"] is None
    assert (out / "summary.md").read_text().count("/metrics is not Prometheus text") == 1


def test_an_out_folder_holding_a_run_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "requests.jsonl").write_text('{"run_id": "x"}\n')
    assert main(["run", "--url", "http://127.0.0.1:1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err and "\n" not in err
    assert (out / "requests.jsonl").read_text() == '{"run_id": "x"}\n'


@pytest.mark.slow
def test_overwrite_replaces_the_run(tmp_path):
    out = tmp_path / "run"
    with instrument_process() as (url, _):
        flags = [
            "run",
            "--url",
            url,
            "--num-sessions",
            "2",
            "--concurrency",
            "1",
            "--workload",
            quick_mini(tmp_path),
            *NOT_ABOUT_LAG,
            "--out",
            str(out),
        ]
        assert main(flags) == 0
        first = [r.identity for r in read_records(out / "requests.jsonl")]
        assert main([*flags, "--overwrite"]) == 0
    second = [r.identity for r in read_records(out / "requests.jsonl")]
    assert sorted(second) == sorted(first) and len(set(second)) == len(second)
    assert len(_entries(out)) == 1


@pytest.mark.slow
def test_resume_keeps_finished_requests_and_sends_only_the_rest(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    with instrument_process() as (url, _):
        flags = [
            "run",
            "--url",
            url,
            "--num-sessions",
            "3",
            "--concurrency",
            "1",
            "--num-requests",
            "100",
            "--workload",
            quick_mini(tmp_path),
            *NOT_ABOUT_LAG,
        ]
        assert main([*flags, "--out", str(whole)]) == 0
        # What a SIGKILL after four answers leaves: the config and the first four records, no summary.
        cut.mkdir()
        shutil.copy(whole / "config.yaml", cut / "config.yaml")
        lines = (whole / "requests.jsonl").read_text().splitlines(keepends=True)
        (cut / "requests.jsonl").write_text("".join(lines[:4]))
        assert main([*flags, "--out", str(cut), "--resume"]) == 0
    resumed = (cut / "requests.jsonl").read_text().splitlines(keepends=True)
    assert resumed[:4] == lines[:4]
    identities = [r.identity for r in read_records(cut / "requests.jsonl")]
    assert sorted(identities) == sorted(r.identity for r in read_records(whole / "requests.jsonl"))
    (before,), (after,) = _entries(whole), _entries(cut)
    for key in ("requests", "completed", "errors", "output_tokens"):
        assert after["summary"]["overall"][key] == before["summary"]["overall"][key], key
    assert (
        after["summary"]["overall"]["cache"]["prompt_tokens"] == before["summary"]["overall"]["cache"]["prompt_tokens"]
    )


def test_report_rebuilds_a_missing_summary_from_the_records(tmp_path, capsys):
    out = tmp_path / "run"
    with instrument_process() as (url, _):
        assert (
            main(
                [
                    "run",
                    "--url",
                    url,
                    "--num-sessions",
                    "3",
                    "--workload",
                    quick_mini(tmp_path),
                    *NOT_ABOUT_LAG,
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
    (written,) = _entries(out)
    for name in ("summary.json", "summary.csv", "summary.md"):
        (out / name).unlink()
    assert main(["report", str(out)]) == 0
    (rebuilt,) = _entries(out)
    assert rebuilt["summary"] == written["summary"]
    assert rebuilt["interrupted"] is True and rebuilt["valid"] is False
    assert "rebuilt" in capsys.readouterr().err


def _engine_pid(out):
    log = (out / "engines" / "kvengine" / "engine.log").read_text()
    return int(next(line for line in log.splitlines() if line.startswith(PID_LINE)).split()[-1])


def _engine_alive(pid):
    """A live (not zombie) process with our engine's command line under `pid`; no psutil, just /proc."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and b"kvbench.engines.kvengine.server.main" in cmdline


def _wait_until_gone(pid, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while _engine_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _engine_alive(pid)


def _driver_on_our_engine(out):
    """A run far longer than the test (4,000 requests), so a signal always lands while it is measuring. It
    starts with SIGINT ignored, as a background job of a script (CI's, say) inherits it: SIGTERM must stop
    the run all the same (it used to do nothing then, and the run went on to its end)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "run",
            "--set",
            "model=tiny-random",
            "--set",
            "kv_capacity=4096",
            "--num-sessions",
            "400",
            "--num-requests",
            "4000",
            "--concurrency",
            "2",
            "--out",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


@pytest.mark.slow
def test_sigterm_stops_the_run_writes_its_summary_and_stops_the_engine(tmp_path):
    out = tmp_path / "run"
    driver = _driver_on_our_engine(out)
    try:
        _wait_for_records(out, driver, 2)
        pid = _engine_pid(out)
        assert _engine_alive(pid)
        driver.send_signal(signal.SIGTERM)
        code = driver.wait(timeout=60)
    finally:
        driver.kill()
    assert code != 0
    assert _wait_until_gone(pid), "the engine outlived kvbench run"
    (entry,) = _entries(out)
    assert entry["interrupted"] is True and entry["valid"] is False
    records = list(read_records(out / "requests.jsonl"))
    assert entry["summary"]["overall"]["requests"] == len([r for r in records if not r.warmup]) >= 2


@pytest.mark.slow
def test_sigkill_of_the_driver_takes_the_engine_along_and_report_rebuilds_the_summary(tmp_path):
    out = tmp_path / "run"
    driver = _driver_on_our_engine(out)
    try:
        _wait_for_records(out, driver, 2)
        pid = _engine_pid(out)
        driver.kill()
        driver.wait(timeout=30)
    finally:
        driver.kill()
    assert _wait_until_gone(pid), "the engine outlived a SIGKILLed kvbench run"
    assert not (out / "summary.json").exists()  # killed before the point ended
    assert main(["report", str(out)]) == 0
    (entry,) = _entries(out)
    assert entry["summary"]["overall"]["requests"] == len(list(read_records(out / "requests.jsonl")))


@pytest.mark.slow
def test_the_oracle_follows_our_engines_isolation_on_a_multi_tenant_workload(tmp_path):
    """Our engine isolates tenants strictly by default, so tenant b cannot reuse tenant a's pages although both
    send the same 64-token context: b's first reusable_tokens is 0, and the recomputation rate is not inflated
    by prefixes the engine may not share. (The client used to follow its own `shared` default here.)"""
    context = list(range(100, 164))
    trace = tmp_path / "two-tenants.jsonl"
    rows = [
        {
            "session_id": "a",
            "turn": 0,
            "arrival_s": 0,
            "tenant": "a",
            "context_tokens": context,
            "user_length": 8,
            "max_tokens": 4,
        },
        {"session_id": "a", "turn": 1, "user_length": 8, "max_tokens": 4},
        {
            "session_id": "b",
            "turn": 0,
            "arrival_s": 1,
            "tenant": "b",
            "context_tokens": context,
            "user_length": 8,
            "max_tokens": 4,
        },
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--set",
            "model=tiny-random",
            "--workload",
            str(trace),
            "--concurrency",
            "1",
            *NOT_ABOUT_LAG,
            "--out",
            str(out),
        ]
    )
    records = {(r.session_id, r.turn): r for r in read_records(out / "requests.jsonl")}
    assert records[("b", 0)].reusable_tokens == 0
    assert records[("a", 1)].reusable_tokens >= len(context)  # a tenant's own earlier prompt still counts
    # Without tenant API keys the engine tells the two tenants apart by nothing, and serves b's context from a's
    # pages (64 cached tokens): more than the strict oracle allows, which the point names as a breach (exit 1).
    if records[("b", 0)].cached_tokens:
        assert code == 1
        assert all("exceeds the oracle's" in reason for entry in _entries(out) for reason in entry["invalid_reasons"])
    else:
        assert code == 0


def test_run_with_two_workers_writes_one_run_folder_with_every_request_and_both_workers_checked(tmp_path):
    with instrument_process("--first-token-ms", "10", "--chunk-interval-ms", "2") as (url, _):
        out = tmp_path / "run"
        code = main(
            [
                "run",
                "--url",
                url,
                "--num-sessions",
                "4",
                "--concurrency",
                "4",
                "--workers",
                "2",
                "--workload",
                quick_mini(tmp_path),
                *NOT_ABOUT_LAG,
                "--out",
                str(out),
            ]
        )
    assert code == 0
    (entry,) = _entries(out)
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    every_turn = load_workload(quick_mini(tmp_path), seed=0, num_sessions=4).num_requests
    assert len(records) == entry["summary"]["overall"]["requests"] == every_turn
    assert len({(r["session_id"], r["turn"]) for r in records}) == every_turn
    assert [worker["valid"] is not None for worker in entry["client"]["workers"]] == [True, True]
    assert entry["client"]["start_spread_ms"] is not None
    assert yaml.safe_load((out / "config.yaml").read_text())["client"]["workers"] == 2
    assert entry["summary"]["overall"]["ttft_from_schedule_ms"] is not None


def _run_config(*flags):
    from kvbench.cli.commands.run_cmd import config_from_args
    from kvbench.cli.main import build_parser

    return config_from_args(build_parser().parse_args(["run", *flags]))


def test_the_main_job_compares_fp32_and_fp8_in_the_same_kv_bytes_below_the_working_set():
    """`kvbench run` with no flags: two settings of our engine in one device KV size that holds less than
    rag-chat-mini's distinct tokens in fp32 and all of them in fp8_e4m3 (SmolLM2-135M's KV geometry), so the
    table shows what FP8 buys; a KV setting or another engine given on the command line runs just that."""
    from kvbench.sim.geometry import load_geometry
    from kvbench.workloads.stats import workload_stats

    config = _run_config()
    assert [(e.engine, e.settings["kv_dtype"]) for e in config.engines] == [
        ("kvengine", "fp32"),
        ("kvengine", "fp8_e4m3"),
    ]
    kv_bytes = {e.settings["kv_capacity_bytes"] for e in config.engines}
    assert len(kv_bytes) == 1
    stats = workload_stats(load_workload(config.workloads[0].name))
    distinct = stats.prompt_tokens_total - stats.reusable_tokens_total
    geometry = load_geometry("smollm2-135m")
    (kv,) = kv_bytes
    assert kv / geometry.kv_bytes_per_token("fp32") < distinct <= kv / geometry.kv_bytes_per_token("fp8_e4m3")
    assert [e.engine for e in _run_config("--set", "kv_dtype=fp8_e5m2").engines] == ["kvengine"]
    assert [e.engine for e in _run_config("--set", "kv_capacity=4096").engines] == ["kvengine"]
    assert [e.engine for e in _run_config("--engine", "kvengine").engines] == ["kvengine"]
