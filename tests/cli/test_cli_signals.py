"""SIGTERM stops `kvbench run` in every loop as Ctrl-C does (issue 46): before, `--request-rate 1e12` (now
refused) or `--burstiness 1e-300` made the arrival loop spin without ever giving the event loop back; no
request was sent and SIGTERM was ignored for 9 minutes. At the fastest rate accepted, SIGTERM ends the run
with its records kept and summarised."""

from __future__ import annotations

import signal
import subprocess
import sys

from kvbench.measure.records import read_records
from kvbench.measure.schedule import MAX_RATE
from tests.harness.instrument_fixture import instrument_process
from tests.quick_workload import quick_mini

from .test_cli_run import _entries, _wait_for_records


def test_sigterm_during_a_rate_loop_at_the_fastest_rate_ends_the_run_with_its_records(tmp_path):
    out = tmp_path / "run"
    with instrument_process("--first-token-ms", "5", "--chunk-interval-ms", "5") as (url, _):
        driver = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvbench.cli",
                "run",
                "--url",
                url,
                "--workload",
                quick_mini(tmp_path),
                "--num-sessions",
                "400",
                "--request-rate",
                f"{MAX_RATE:g}",
                "--burstiness",
                "0.001",
                "--max-concurrency",
                "4",
                "--num-requests",
                "100000",
                "--max-lag-ms",
                "1000",
                "--out",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )  # as a script's background job
        try:
            _wait_for_records(out, driver, 5)
            driver.send_signal(signal.SIGTERM)
            code = driver.wait(timeout=60)
        finally:
            driver.kill()
            driver.wait()
    assert code != 0
    (entry,) = _entries(out)
    assert entry["interrupted"] is True
    records = list(read_records(out / "requests.jsonl"))
    assert entry["summary"]["overall"]["requests"] == len([r for r in records if not r.warmup]) >= 5
    assert b"Traceback" not in driver.stderr.read()
