"""The client against older versions of itself, alternated in one run: TTFT error and request rate against the
instrument, the instrument on one core and each client on another (`taskset`).

    python benchmarks/client_ab.py [--versions pre-checks=17896db,main=main,this=.] [--streams 100,1000] [--rounds 2]

Each version is a git ref of this repository (its `kvbench/` unpacked into a temporary folder) or `.`, this
checkout. A round runs every version once per stream count, the versions' order turned around each round, so
that a machine that gets busier or quieter during the run weighs on every version alike. Each run is a closed
loop of `--streams` streams, 4 single-turn requests per stream (32 prompt tokens, 8 answer tokens), against the
instrument answering after 50 ms and every 20 ms after (`kvbench bench loadgen`'s); TTFT error is measured TTFT
minus those 50 ms, the rate completed requests over the span from the first send to the last answer.

Defaults: `pre-checks` is the commit before the answer checks (f6dd1d5, "Server answers through one parse") and
`main` the lead's branch. A benchmark (it prints a table), not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
FIRST_TOKEN_MS, CHUNK_INTERVAL_MS = 50.0, 20.0

# Run with the version's kvbench first on sys.path; only what every version since the answer checks has.
DRIVER = """
import json, sys
import numpy as np
from kvbench.harness import eventloop
from kvbench.harness.bench_loadgen import single_turn_workload
from kvbench.harness.client import EndpointConfig
from kvbench.harness.loadgen import LoadGenerator
from kvbench.measure.schedule import LoadSpec
url, streams = sys.argv[1], int(sys.argv[2])
generator = LoadGenerator(EndpointConfig(url, "instrument"), LoadSpec(concurrency=streams), run_id="ab")
records = eventloop.run(generator.run(single_turn_workload(4 * streams, max_tokens=8))).records
ok = [r for r in records if r.ok and r.first_token_ns is not None]
errors = np.array([(r.first_token_ns - r.sent_ns) / 1e6 - %(first)s for r in ok])
span = (max(r.done_ns for r in ok) - min(r.sent_ns for r in ok)) / 1e9
print(json.dumps({"failed": len(records) - len(ok), "p50": float(np.percentile(errors, 50)),
                  "p99": float(np.percentile(errors, 99)), "req_s": len(ok) / span}))
""" % {"first": FIRST_TOKEN_MS}


def unpack(ref: str, into: Path) -> Path:
    """`ref`'s kvbench package in a folder of its own (`.`: this checkout as it is)."""
    if ref == ".":
        return REPO
    folder = into / ref.replace("/", "_")
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "kvbench"], capture_output=True, check=True)
    archive_path = folder / "kvbench.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(folder, filter="data")
    return folder


def start_instrument(core: int) -> tuple[subprocess.Popen, str]:
    import socket

    from kvbench.engines.http import request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [
            "taskset",
            "-c",
            str(core),
            sys.executable,
            "-m",
            "kvbench.harness.instrument",
            "--port",
            str(port),
            "--first-token-ms",
            str(FIRST_TOKEN_MS),
            "--chunk-interval-ms",
            str(CHUNK_INTERVAL_MS),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if request("GET", url + "/health", timeout_s=1).ok:
            return process, url
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the instrument server did not start")


def measure(tree: Path, url: str, streams: int, core: int) -> dict:
    done = subprocess.run(
        ["taskset", "-c", str(core), sys.executable, "-c", DRIVER, url, str(streams)],
        capture_output=True,
        text=True,
        cwd=tree,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"client run in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--versions",
        default="pre-checks=17896db,main=main,this=.",
        help="NAME=REF,... (REF a git ref, or . for this checkout)",
    )
    parser.add_argument("--streams", default="100,1000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--instrument-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    args = parser.parse_args()
    versions = [tuple(item.split("=", 1)) for item in args.versions.split(",")]
    streams = [int(value) for value in args.streams.split(",")]
    table = Table(
        title=f"client A/B against the instrument ({FIRST_TOKEN_MS:g} ms TTFT), alternated; "
        f"instrument on core {args.instrument_core}, client on core {args.client_core}"
    )
    for column in ("round", "streams", "version", "TTFT error p50 ms", "p99 ms", "req/s", "failed"):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as scratch:
        trees = {name: unpack(ref, Path(scratch)) for name, ref in versions}
        instrument, url = start_instrument(args.instrument_core)
        try:
            for round_index in range(args.rounds):
                order = versions if round_index % 2 == 0 else versions[::-1]
                for count in streams:
                    for name, _ in order:
                        result = measure(trees[name], url, count, args.client_core)
                        table.add_row(
                            str(round_index + 1),
                            str(count),
                            name,
                            f"{result['p50']:.1f}",
                            f"{result['p99']:.1f}",
                            f"{result['req_s']:,.0f}",
                            str(result["failed"]),
                        )
        finally:
            instrument.kill()
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
