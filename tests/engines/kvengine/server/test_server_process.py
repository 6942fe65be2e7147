"""`kvbench serve` as a process: an engine failure exits non-zero (a supervisor sees it), a bad tenants file
exits 2 with one line, and the adapter resets and scrapes with the admin key it gave the server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvbench.engines.http import request
from kvbench.engines.kvengine.adapter import KVEngineAdapter

from ..runtime.tiers_fixtures import free_port

BAD_TENANTS = Path(__file__).parents[3] / "data" / "bad_inputs" / "tenants"
BROKEN_SCHEDULER = """
import sys
from kvbench.engines.kvengine.core.scheduler import Scheduler

real_schedule = Scheduler.schedule


def schedule(self, now):
    if self.has_work():
        raise AssertionError("injected: the scheduler is broken")
    return real_schedule(self, now)


Scheduler.schedule = schedule
from kvbench.engines.kvengine.server.main import main

sys.exit(main(sys.argv[1:]))
"""


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        if request("GET", url + "/health", timeout_s=2).ok:
            return
        time.sleep(0.2)
    pytest.fail("the server never became healthy")


@pytest.mark.slow
def test_an_engine_failure_exits_the_server_process_non_zero(tmp_path):
    script = tmp_path / "broken_serve.py"
    script.write_text(BROKEN_SCHEDULER)
    port = free_port()
    process = subprocess.Popen(
        # a number of prefill tokens: `auto` would time steps at start, and the scheduler fails at its first
        [
            sys.executable,
            str(script),
            "--model",
            "tiny-random",
            "--kv-capacity",
            "2048",
            "--port",
            str(port),
            "--max-prefill-beside-decodes",
            "64",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        reply = request(
            "POST",
            url + "/v1/completions",
            timeout_s=60,
            json_body={"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True},
        )
        assert not reply.ok  # a 500 naming the failure, or the connection closed as the server went down
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, output
    assert "engine failure" in output and "injected: the scheduler is broken" in output


@pytest.mark.parametrize("name", ["wrong_type_quota.yaml", "not_yaml.yaml", "binary.yaml"])
def test_a_bad_tenants_file_exits_2_with_one_line_before_the_model_loads(name):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbench.engines.kvengine.server.main",
            "--model",
            "tiny-random",
            "--tenants-file",
            str(BAD_TENANTS / name),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_adapter_resets_and_scrapes_with_its_admin_key_while_the_run_uses_a_tenant_key(tmp_path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  acme:\n    api_keys: [k-acme]\n")
    adapter = KVEngineAdapter(
        {"model": "tiny-random", "kv_capacity": 2048, "tenants_file": str(tenants), "api_key": "k-acme"}, tmp_path
    )
    assert not any("admin" in part for part in adapter.command())  # the key travels in the environment
    adapter.start()
    try:
        adapter.wait_healthy(180)
        url = adapter.base_url
        body = json.dumps({"prompt": list(range(40)), "max_tokens": 2}).encode()
        tenant_call = urllib.request.Request(
            url + "/v1/completions",
            data=body,
            headers={"Authorization": "Bearer k-acme", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(tenant_call, timeout=60) as reply:
            assert reply.status == 200
        assert not request("POST", url + "/reset_prefix_cache", api_key="k-acme").ok  # a tenant may not
        assert adapter.reset_cache()
        samples = adapter.scrape_metrics()
        assert samples is not None and any('tenant="acme"' in name for name in samples)
    finally:
        adapter.stop()


def start_tp2_server(log_path: Path) -> tuple[subprocess.Popen, str, int]:
    """`kvbench serve` at tensor_parallel_size 2, healthy and answering; returns it, its URL and rank 1's pid."""
    port = free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvbench.engines.kvengine.server.main",
                "--model",
                "tiny-random",
                "--kv-capacity",
                "2048",
                "--tensor-parallel-size",
                "2",
                "--threads",
                "1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        reply = request(
            "POST",
            url + "/v1/completions",
            timeout_s=60,
            json_body={"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True},
        )
        assert reply.ok, reply.error  # both ranks serve
        started = re.search(r"tensor-parallel rank 1 started \(pid (\d+)\)", log_path.read_text())
        assert started, log_path.read_text()
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, url, int(started.group(1))


def gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_a_dead_worker_rank_takes_the_tensor_parallel_server_down_with_a_line_naming_it(tmp_path):
    process, _, worker = start_tp2_server(tmp_path / "serve.log")
    try:
        os.kill(worker, signal.SIGKILL)
        process.wait(timeout=60)  # a bound, not a timing assertion: a hang fails here
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = (tmp_path / "serve.log").read_text()
    assert process.returncode == 1, output
    assert f"tensor-parallel rank 1 (pid {worker}) exited with code -9" in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_a_stopped_tensor_parallel_server_exits_0_and_its_worker_rank_with_it(tmp_path):
    """SIGTERM (how the adapter stops it) reaches rank 0 alone, which closes the worker's stdin. (A rank 0 killed
    outright takes its workers with it through PR_SET_PDEATHSIG, as every engine process is launched.)"""
    process, _, worker = start_tp2_server(tmp_path / "stopped.log")
    try:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, (tmp_path / "stopped.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert gone(worker, 30)
