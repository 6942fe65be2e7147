"""The shared launch pieces: flag checking against a help text, and the launched-server lifecycle on a tiny
stand-in server (a real process: start, health, reset, cold-cache probe, /metrics, stop, log kept)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvbench.engines.base import EngineError
from kvbench.engines.launch import (
    LaunchedServer,
    LaunchPlan,
    command_flags,
    command_problems,
    free_port,
    help_choices,
    help_flags,
    probe_for,
    probe_tokens,
    respell,
)

HELP = textwrap.dedent("""\
    usage: serve [-h] [--model MODEL] [--kv-cache-dtype {auto,fp8,fp8_e5m2}]
                 [--enable-prefix-caching | --no-enable-prefix-caching]
      --port PORT  Port number.
""")


def test_help_flags_and_choices_come_from_usage_and_option_lines():
    assert help_flags(HELP) == {
        "--model",
        "--kv-cache-dtype",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--port",
    }
    assert help_choices(HELP, "--kv-cache-dtype") == {"auto", "fp8", "fp8_e5m2"}
    assert help_choices(HELP, "--model") is None


def test_choices_in_click_and_vllm_033_styles_are_read():
    assert help_choices("  --backend [pytorch|tensorrt|_autodeploy]\n", "--backend") == {
        "pytorch",
        "tensorrt",
        "_autodeploy",
    }
    assert help_choices("[--kv-cache-dtype ['auto', 'fp8']]", "--kv-cache-dtype") == {"auto", "fp8"}
    assert help_choices("  --port INTEGER  [default: 8000]", "--port") is None


def test_respell_uses_the_first_spelling_the_help_lists():
    spellings = {"--no-enable-prefix-caching": ("--disable-prefix-caching",)}
    new_help = "[--enable-prefix-caching | --disable-prefix-caching]"
    command = ("vllm", "--no-enable-prefix-caching", "--port=1")
    assert respell(command, new_help, spellings) == ("vllm", "--disable-prefix-caching", "--port=1")
    assert respell(command, HELP, spellings) == command  # the old help lists the flag itself


def test_command_problems_name_unknown_flags_and_bad_choices():
    good = ["python", "-m", "x", "--model", "m", "--kv-cache-dtype", "fp8", "--port=8000", "--enable-prefix-caching"]
    assert command_flags(good) == ["--model", "--kv-cache-dtype", "--port", "--enable-prefix-caching"]
    assert command_problems(good, HELP) == []
    bad = ["python", "--model", "m", "--kv-cache-dtype", "fp8_e4m3", "--enable-prefix-cache"]
    assert command_problems(bad, HELP) == [
        "unknown flag --enable-prefix-cache",
        "--kv-cache-dtype 'fp8_e4m3' is not one of {auto,fp8,fp8_e5m2}",
    ]


def test_probe_is_deterministic_inside_the_vocabulary_and_fits_the_context():
    assert probe_tokens(64, 1000) == probe_tokens(64, 1000)
    assert all(100 <= token < 1000 for token in probe_tokens(512, 1000))
    assert len(probe_for(None, None)) == 512 and len(probe_for(300, None)) == 298


# A stand-in engine: /health, /reset (empties its "cache"), /v1/completions reporting cached prompt tokens as the
# longest prefix seen before, /metrics with a cached-tokens counter. `BROKEN_RESET` makes /reset keep the cache.
STAND_IN = textwrap.dedent("""\
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    seen, totals = [], {"cached": 0}
    broken = "--broken-reset" in sys.argv
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): print("request", *a, flush=True)
        def reply(self, code, body, kind="application/json"):
            data = body.encode(); self.send_response(code); self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
        def do_GET(self):
            if self.path == "/health": return self.reply(200, "{}")
            if self.path == "/metrics":
                return self.reply(200, "# TYPE x:cached_tokens counter\\nx:cached_tokens_total %d\\n" % totals["cached"], "text/plain")
            self.reply(404, "{}")
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/reset":
                if not broken: seen.clear()
                return self.reply(200, "{}")
            prompt = json.loads(body)["prompt"]
            cached = max([next((i for i, (a, b) in enumerate(zip(p, prompt)) if a != b), min(len(p), len(prompt))) for p in seen] or [0])
            seen.append(prompt); totals["cached"] += cached
            self.reply(200, json.dumps({"usage": {"prompt_tokens": len(prompt), "prompt_tokens_details": {"cached_tokens": cached}}}))
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _stand_in(tmp_path: Path, *extra: str) -> LaunchedServer:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    plan = LaunchPlan(command=(sys.executable, str(script), str(port), *extra), files={"conf.yaml": "a: 1\n"})
    return LaunchedServer(plan, tmp_path / "engine", port, check_flags=False)


def test_launched_server_lifecycle_reset_probe_and_metrics(tmp_path):
    server = _stand_in(tmp_path)
    server.start()
    try:
        server.wait_healthy(20)
        assert (tmp_path / "engine" / "conf.yaml").read_text() == "a: 1\n"
        tokens = probe_tokens(32)
        assert server.verify_cold("m", tokens).cached_tokens == 0  # first probe: nothing cached yet
        server.post("/reset")
        assert server.verify_cold("m", tokens).cached_tokens == 0  # the reset dropped the first probe
        assert server.scrape() == {"x:cached_tokens_total": 0.0}
    finally:
        server.stop()
    assert "request" in (tmp_path / "engine" / "engine.log").read_text()  # the engine's log stays in its folder


def test_a_reset_that_keeps_the_cache_is_caught_by_the_probe(tmp_path):
    server = _stand_in(tmp_path, "--broken-reset")
    server.start()
    try:
        server.wait_healthy(20)
        server.verify_cold("m", probe_tokens(32))
        server.post("/reset")
        with pytest.raises(EngineError, match="did not empty the prefix cache: the probe prompt found 32 cached"):
            server.verify_cold("m", probe_tokens(32))
    finally:
        server.stop()


def test_flag_check_refuses_a_flag_the_installed_engine_lacks(tmp_path):
    help_script = tmp_path / "help.py"
    help_script.write_text(f"print({HELP!r})")
    plan = LaunchPlan(
        command=(sys.executable, "-c", "pass", "--model", "m", "--kv-cache-dtpye", "fp8"),
        help_command=(sys.executable, str(help_script)),
    )
    server = LaunchedServer(plan, tmp_path / "engine", free_port())
    with pytest.raises(EngineError, match="unknown flag --kv-cache-dtpye"):
        server.start()
    assert "--kv-cache-dtype" in (tmp_path / "engine" / "engine-help.txt").read_text()
    assert not (tmp_path / "engine" / "engine.log").exists()  # refused before launching anything


def test_a_process_that_dies_reports_its_log_tail(tmp_path):
    plan = LaunchPlan(command=(sys.executable, "-c", "print('boom: no GPU found'); raise SystemExit(3)"))
    server = LaunchedServer(plan, tmp_path / "engine", free_port(), check_flags=False)
    server.start()
    with pytest.raises(EngineError, match=r"(?s)exited with code 3.*boom: no GPU found"):
        server.wait_healthy(20)


# A driver that launches a long-sleeping "engine", prints the engine's pid from its log, and waits to be killed.
DRIVER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from kvbench.engines.process import PID_LINE, ManagedProcess
    engine = ManagedProcess([sys.executable, "-c", "import time; time.sleep(600)"], {}, Path(sys.argv[1]))
    engine.start()
    line = next(l for l in Path(sys.argv[1]).read_text().splitlines() if l.startswith(PID_LINE))
    print(line.split()[-1], flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_engine_dies_with_its_driver_even_by_sigkill(tmp_path):
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path / "engine.log")], stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(driver.stdout.readline())
        assert _alive(pid)
        driver.kill()
        driver.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the engine outlived its SIGKILLed driver"
    finally:
        driver.kill()
