"""`kvbench run` end to end: our engine as a real process, the instrument server, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pandas as pd

from kvbench.harness.cli import main
from kvbench.harness.records import read_records
from kvbench.harness.report import COLUMNS

from .instrument_fixture import free_port


def test_run_on_our_engine_writes_every_result_file(tmp_path):
    out = tmp_path / "run"
    code = main(["run", "--set", "model=tiny-random", "--set", "kv_capacity=4096", "--num-sessions", "4",
                 "--concurrency", "2", "--out", str(out)])
    assert code == 0
    for name in ("config.yaml", "env.json", "requests.jsonl", "summary.json", "summary.csv", "summary.md",
                 "ttft_cdf.png", "throughput_vs_ttft_p99.png", "engines/kvengine/engine.log"):
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


def test_unreachable_url_fails_before_load_with_exit_2(tmp_path, capsys):
    code = main(["run", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "x")])
    assert code == 2
    assert "cannot reach" in capsys.readouterr().err
    assert not (tmp_path / "x" / "requests.jsonl").exists() or not (tmp_path / "x" / "requests.jsonl").read_text()


def test_unknown_workload_engine_and_yaml_key_are_named_with_choices(tmp_path, capsys):
    assert main(["run", "--workload", "rag-chat-maxi", "--url", "http://127.0.0.1:1", "--out", str(tmp_path / "n")]) == 2
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
    server = subprocess.Popen([sys.executable, "-m", "kvbench.harness.instrument", "--port", str(port),
                               "--first-token-ms", "30", "--chunk-interval-ms", "10"])
    try:
        deadline = time.monotonic() + 20
        from kvbench.engines.http import request

        while not request("GET", f"http://127.0.0.1:{port}/health", timeout_s=1).ok:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        out = tmp_path / "run"
        killer = threading.Timer(2.0, server.kill)
        killer.start()
        code = main(["run", "--url", f"http://127.0.0.1:{port}", "--workload", "rag-chat-mini",
                     "--concurrency", "2", "--out", str(out)])
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
