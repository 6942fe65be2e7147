"""Issue 46's cases for `hostile_load_bench.py --issue46`: engine attacks timed beside a normal request, and
command lines that must answer in one line (or finish) within 10 s, under 1 GB resident, without a traceback.

Engine cases (each against `kvbench serve --model tiny-random` from the source tree, max_num_seqs 16): the
normal request is a non-streaming "hello world" completion of 16 tokens, sent one after another while the
attack runs; its idle latency is measured first. CLI cases run `python -m kvbench.cli ...` from the source
tree with a watchdog: SIGTERM at 10 s (does it stop?), SIGKILL 5 s later or past 2 GB resident; the peak
resident memory is the most its process group held at any 50 ms sample (wait4's ru_maxrss would count this
process's memory, which a child shares until it execs).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

HELLO = {"model": "default", "prompt": "hello world", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
CLI_ANSWER_S, CLI_GRACE_S, RSS_CAP_KB = 10.0, 5.0, 2 << 20


async def post(session: aiohttp.ClientSession, url: str, data: bytes, timeout_s: float = 300) -> tuple[int, int]:
    """(status, body bytes) of one POST of raw bytes; status 0 when it failed."""
    try:
        async with session.post(
            url, data=data, headers={"Content-Type": "application/json"}, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as reply:
            return reply.status, len(await reply.read())
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return 0, 0


async def normal_ms(session: aiohttp.ClientSession, base: str) -> float | None:
    sent = time.perf_counter()
    status, _ = await post(session, base + "/v1/completions", json.dumps(HELLO).encode(), 120)
    return (time.perf_counter() - sent) * 1e3 if status == 200 else None


async def stop_300k(session, base, port, seen):
    body = {**HELLO, "max_tokens": 256, "stop": [f"never-{i}" for i in range(300_000)]}
    seen[f"status {(await post(session, base + '/v1/completions', json.dumps(body).encode()))[0]}"] += 1


async def utf16_deep(session, base, port, seen):
    raw = ("[" * 100_000 + "]" * 100_000).encode("utf-16-le")
    seen[f"status {(await post(session, base + '/v1/completions', raw))[0]}"] += 1


async def utf16_objects(session, base, port, seen):
    raw = json.dumps({**HELLO, "extra": [{}] * 300_000}).encode("utf-16-le")
    seen[f"status {(await post(session, base + '/v1/completions', raw))[0]}"] += 1


async def long_prompts(session, base, port, seen):
    words = ("the cache keeps every page it can while the server answers " * 600)[:30_000]
    body = json.dumps({**HELLO, "prompt": words, "max_tokens": 1}).encode()
    for status, _ in await asyncio.gather(*(post(session, base + "/v1/completions", body) for _ in range(40))):
        seen[f"status {status}"] += 1


async def stalled_streams(session, base, port, seen):
    """16 streams of 8,000 tokens whose clients never read, held 20 s; /ready polled meanwhile; then how many
    times a request was parked and how many streams were ended for their stall, from /metrics."""
    body = json.dumps({**HELLO, "max_tokens": 8000, "stream": True, "logprobs": 5}).encode()
    socks = []
    for _ in range(16):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        socks.append(sock)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            async with session.get(base + "/ready") as reply:
                seen[f"/ready {(await reply.json()).get('status')}"] += 1
            await asyncio.sleep(0.5)
        async with session.get(base + "/metrics") as reply:
            text = await reply.text()
        for name in ("kvbench:requests_parked_total", "kvbench:client_stalled_total"):
            values = [line.split()[-1] for line in text.splitlines() if line.startswith(name)]
            seen[f"{name.split(':')[1]} {float(values[0]):g}" if values else f"{name.split(':')[1]} n/a"] += 1
    finally:
        for sock in socks:
            sock.close()


async def big_values(session, base, port, seen):
    for name, value in (("temperature", "x" * 3_000_000), ("max_tokens", 10**3999)):
        status, size = await post(session, base + "/v1/completions", json.dumps({**HELLO, name: value}).encode())
        seen[f"{name}: {status}, {size:,} B error body"] += 1


ENGINE_CASES = {
    "stop list of 300,000": stop_300k,
    "UTF-16 nested 100,000 deep": utf16_deep,
    "UTF-16 holding 300,000 {}": utf16_objects,
    "40 x 30,000-char prompts": long_prompts,
    "16 streams never read": stalled_streams,
    "3 MB / 4,000-digit values": big_values,
}


async def engine_rows(base: str, port: int) -> list[dict]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        idle = [t for t in [await normal_ms(session, base) for _ in range(10)] if t is not None]
        rows = [{"case": "idle", "normal": idle, "failed": 10 - len(idle), "seen": {}}]
        for name, attack in ENGINE_CASES.items():
            seen: collections.Counter = collections.Counter()
            task = asyncio.create_task(attack(session, base, port, seen))
            await asyncio.sleep(0.2)
            latencies = []
            while not task.done() or len(latencies) < 5:
                latencies.append(await normal_ms(session, base))
            await task
            ok = [t for t in latencies if t is not None]
            rows.append({"case": name, "normal": ok, "failed": len(latencies) - len(ok), "seen": dict(seen)})
            await asyncio.sleep(2.0)  # what the attack left running ends before the next one
    return rows


def engine_table(label: str, rows: list[dict]) -> list[str]:
    idle = np.median(rows[0]["normal"]) if rows[0]["normal"] else float("nan")
    lines = []
    for row in rows:
        times = np.array(row["normal"])
        worst = times.max() if times.size else float("nan")
        seen = ", ".join(f"{k} x{v}" for k, v in sorted(row["seen"].items())) or "-"
        lines.append(
            f"| {label} | {row['case']} | {times.size} ok, {row['failed']} failed | "
            f"{np.median(times):,.0f} | {worst:,.0f} | {worst / idle:,.1f}x | {seen} |"
        )
    return lines


# --- command lines ------------------------------------------------------------------------------------------


def make_data(folder: Path) -> dict[str, Path]:
    """The hostile files, written once into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        name: folder / name
        for name in (
            "big-message.json",
            "million.json",
            "vllm-deep.json",
            "aiperf-unit.json",
            "guidellm-totals.json",
            "vllm-label.json",
            "guidellm-100k.json",
        )
    }
    repo = Path(__file__).resolve().parents[1] / "tests" / "data"
    vllm = json.loads((repo / "vllm_bench" / "serve_result.json").read_text())
    aiperf = json.loads((repo / "aiperf" / "profile_export_aiperf.json").read_text())
    guidellm = json.loads((repo / "guidellm" / "benchmarks.json").read_text())
    writers = {
        "big-message.json": lambda: json.dumps(
            [
                {
                    "id": "big",
                    "conversations": [
                        {"from": "human", "value": "hello " * 17_000_000},
                        {"from": "gpt", "value": "ok"},
                    ],
                }
            ]
        ),
        "million.json": lambda: json.dumps(
            [
                {
                    "id": f"c{i}",
                    "conversations": [
                        {"from": "human", "value": f"hello world {i}"},
                        {"from": "gpt", "value": "the cache"},
                    ],
                }
                for i in range(1_000_000)
            ]
        ),
        "vllm-deep.json": lambda: json.dumps(vllm)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "aiperf-unit.json": lambda: json.dumps(
            {**aiperf, "time_to_first_token": {**aiperf["time_to_first_token"], "unit": ["ms"]}}
        ),
        "guidellm-totals.json": lambda: json.dumps(
            {
                **guidellm,
                "benchmarks": [
                    {
                        **guidellm["benchmarks"][0],
                        "metrics": {**guidellm["benchmarks"][0]["metrics"], "request_totals": "x"},
                    }
                ],
            }
        ),
        "vllm-label.json": lambda: json.dumps({**vllm, "label": "L" * 5_000_000}),
        "guidellm-100k.json": lambda: json.dumps(
            {**guidellm, "benchmarks": [{"metrics": {"request_totals": {"successful": 1, "errored": 0}}}] * 100_000}
        ),
    }
    for name, path in files.items():
        if not path.exists():
            path.write_text(writers[name]())
    return files


def cli_cases(url: str, files: dict[str, Path], tokenizer: Path, port: int) -> dict[str, list[str]]:
    run = ["run", "--url", url, "--workload", "random", "--num-requests", "5", "--max-lag-ms", "1000"]
    data = ["run", "--url", url, "--tokenizer", str(tokenizer), "--num-requests", "3", "--max-lag-ms", "1000"]
    return {
        "run --request-rate 1e12": [*run, "--request-rate", "1e12"],
        "run --burstiness 1e-300 --request-rate 5": [*run, "--burstiness", "1e-300", "--request-rate", "5"],
        "run --request-rate 1e400": [*run, "--request-rate", "1e400"],
        "run --goodput ttft:5 ttft:7": [*run, "--goodput", "ttft:5", "ttft:7"],
        "simulate --nodes 100000": ["simulate", "--nodes", "100000", "--no-plots"],
        "sharegpt: one 100 MB message": [*data, "--workload", f"sharegpt:{files['big-message.json']}"],
        "sharegpt: 10^6 conversations, 3 requests": [*data, "--workload", f"sharegpt:{files['million.json']}"],
        "report: vLLM nested 100,000 deep": ["report", str(files["vllm-deep.json"])],
        'report: AIPerf unit ["ms"]': ["report", str(files["aiperf-unit.json"])],
        'report: guidellm request_totals "x"': ["report", str(files["guidellm-totals.json"])],
        "report: vLLM 5 MB label": ["report", str(files["vllm-label.json"])],
        "report: guidellm 100,000 benchmarks": ["report", str(files["guidellm-100k.json"])],
        "serve --tier-secret S": ["serve", "--model", "tiny-random", "--port", str(port), "--tier-secret", "S"],
    }


def run_cli(source: Path, argv: list[str], workdir: Path) -> dict:
    """Run `kvbench ARGV` from `source`: its outcome, seconds, peak RSS (MB) and the last stderr line."""
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_WAIT_POLICY": "PASSIVE"}
    workdir.mkdir(parents=True, exist_ok=True)
    err_path = workdir / "stderr.txt"
    with err_path.open("wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "kvbench.cli", *argv],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    start, termed, killed, status, peak_kb = time.monotonic(), None, None, None, 0
    while status is None:
        pid, status_code, _ = os.wait4(child.pid, os.WNOHANG)
        if pid:
            status = status_code
            break
        elapsed = time.monotonic() - start
        peak_kb = max(peak_kb, _rss_kb(child.pid))
        if peak_kb > RSS_CAP_KB and killed is None:
            killed = "past 2 GB resident"
            os.killpg(child.pid, signal.SIGKILL)
        elif elapsed > CLI_ANSWER_S and termed is None:
            termed = elapsed
            os.killpg(child.pid, signal.SIGTERM)
        elif termed is not None and elapsed > termed + CLI_GRACE_S and killed is None:
            killed = "SIGTERM ignored"
            os.killpg(child.pid, signal.SIGKILL)
        time.sleep(0.05)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - start
    text = err_path.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("[")]
    if killed:
        outcome = f"killed: {killed}"
    elif "Traceback" in text:
        outcome = "traceback: " + (lines[-1] if lines else "")
    elif termed is not None:
        outcome = f"no answer in {CLI_ANSWER_S:g} s; stopped by SIGTERM"
    elif child.returncode in (0, 1):
        outcome = f"finished (exit {child.returncode})"
    else:
        outcome = f"{len(lines)} line(s): " + (lines[-1] if lines else "")
    return {"outcome": outcome[:150], "seconds": seconds, "rss_mb": peak_kb / 1024}


def _rss_kb(pid: int) -> int:
    """Resident KB of `pid` and its children (the group a run starts)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pid:
                continue
            status = (entry / "status").read_text()
        except (OSError, ProcessLookupError):
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total
