"""`kvbench run` against a misbehaving OpenAI-compatible server, one case per misbehaviour: what a user gets.

The server is the measurement instrument of this checkout (`kvbench.harness.instrument`, its `--override`,
`--ignore-max-tokens` and `--first-event-bytes` modes); the client is `kvbench run` from `--client-src` (default
this checkout), so the same cases can be put to another version, e.g. `git archive main | tar -x -C /tmp/main`:

    python benchmarks/misbehaving_servers.py                          # this checkout
    python benchmarks/misbehaving_servers.py --client-src /tmp/main   # another version's client

Each case runs two load points (concurrency 1, then 2) of rag-chat-mini's first 3 sessions, with
request_timeout_s 10 (600 by default) and max_lag_ms 1000 (but the client-lag case), and prints one table row:
exit code, wall seconds, valid points, completed requests, out tok/s and cache hit of the first point, and the
first invalid reason or the traceback's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent.parent

# name -> (instrument flags, client settings beyond the defaults above)
CASES = {
    "usage.prompt_tokens 'lots'": (["--override", 'usage.prompt_tokens="lots"'], {}),
    "usage a list": (["--override", "usage=[1, 2]"], {}),
    "choices ['oops']": (["--override", 'choices=["oops"]'], {}),
    "token_ids ['zz']": (["--override", 'choices.0.token_ids=["zz"]'], {}),
    "negative usage (-47)": (["--override", "usage.completion_tokens=-47"], {}),
    "usage 1e30": (["--override", "usage.completion_tokens=1e30"], {}),
    "choices [] with usage": (["--override", "choices=[]"], {}),
    "cached > prompt": (["--override", "usage.prompt_tokens_details.cached_tokens=100000"], {}),
    "usage != streamed ids": (["--override", "usage.completion_tokens=1"], {}),
    "ignores max_tokens": (["--ignore-max-tokens"], {}),
    "one 20 MB event": (["--first-event-bytes", "20000000"], {}),
    "client lag only": ([], {"max_lag_ms": 0.000001}),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_case(name: str, flags: list[str], client: dict, client_src: Path, work: Path, timeout_s: float) -> list[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    server = subprocess.Popen(
        [sys.executable, "-m", "kvbench.harness.instrument", "--port", str(port), *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=HERE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        settings = {"request_timeout_s": 10, "stall_timeout_s": 5, "max_lag_ms": 1000, **client}
        config = work / f"{abs(hash(name))}.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "engines": [{"engine": "endpoint", "settings": {"url": url}}],
                    "workloads": [{"name": "rag-chat-mini", "num_sessions": 3}],
                    "loads": [{"concurrency": 1}, {"concurrency": 2}],
                    "client": settings,
                }
            )
        )
        out = work / f"{abs(hash(name))}-run"
        start = time.perf_counter()
        try:
            # cwd: not this checkout (`python -m` puts the working directory first on sys.path)
            done = subprocess.run(
                [sys.executable, "-m", "kvbench.cli", "run", str(config), "--out", str(out)],
                env={**os.environ, "PYTHONPATH": str(client_src), "COLUMNS": "200"},
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=work,
            )
            code, stderr = str(done.returncode), done.stderr
        except subprocess.TimeoutExpired:
            code, stderr = f"killed at {timeout_s:g} s", ""
        wall = time.perf_counter() - start
    finally:
        server.kill()
        server.wait()
    return [name, code, f"{wall:.1f}", *describe(out, stderr)]


def describe(out: Path, stderr: str) -> list[str]:
    summary = out / "summary.json"
    entries = json.loads(summary.read_text())["runs"] if summary.exists() else []
    traceback = "Traceback" in stderr
    last = stderr.strip().splitlines()[-1][:90] if traceback else ""
    if not entries:
        return ["0/0", "-", "-", "-", f"no summary; {last}" if last else "no summary"]
    first = entries[0]["summary"]["overall"]
    valid = sum(entry["valid"] for entry in entries)
    tok_s = first["output_tok_s"]
    hit = first["cache"]["cache_hit_rate"]
    reasons = [reason for entry in entries for reason in entry.get("invalid_reasons") or []]
    note = reasons[0][:110] if reasons else (last or "all valid")
    return [
        f"{valid}/{len(entries)}",
        f"{first['completed']}/{first['requests']}",
        "n/a" if tok_s is None else f"{tok_s:.3g}",
        "n/a" if hit is None else f"{hit:.0%}",
        note,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-src", type=Path, default=HERE, help="the kvbench source tree whose client runs")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--timeout-s", type=float, default=150.0, help="per case")
    args = parser.parse_args()
    names = args.cases.split(",") if args.cases else list(CASES)
    header = ["case", "exit", "wall s", "valid points", "completed (pt 1)", "out tok/s", "hit", "first reason / error"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            flags, client = CASES[name]
            row = run_case(name, flags, client, args.client_src.resolve(), Path(work), args.timeout_s)
            print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |", flush=True)


if __name__ == "__main__":
    main()
