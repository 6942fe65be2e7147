"""The client against older versions of itself, alternated in one run: TTFT error, request rate and client CPU
per request against the instrument, the instrument on one core and each client on another (`taskset`).

    python benchmarks/client_ab.py [--versions pre-checks=17896db,this=.] [--streams 100,1000] [--rounds 4]

Each version is a git ref of this repository (its `kvbench/` unpacked into a temporary folder) or `.`, this
checkout. A round runs every version once per stream count, the versions' order turned around each round, so
that a machine that gets busier or quieter during the run weighs on every version alike. Each run is a closed
loop of `--streams` streams, 4 single-turn requests per stream (32 prompt tokens, 8 answer tokens), against the
instrument answering after 50 ms and every 20 ms after (`kvbench bench loadgen`'s); TTFT error is measured TTFT
minus those 50 ms, the rate completed requests over the span from the first send to the last answer, CPU the
client process's CPU time (user + system) over the run per request.

The second table pairs each version with the first of `--versions` round by round: the median of the paired
differences and their range over the rounds, which holds the true median difference with probability
1 - 2 x 0.5^rounds (87.5% at 4 rounds, 97% at 6), whatever the noise's distribution.

Defaults: `pre-checks` is the commit before the answer checks (17896db, the parent of f6dd1d5 "Server answers
through one parse"). A benchmark (it prints tables), not a test; timings on a shared machine are noisy, and the
load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
import json, sys, time
import numpy as np
from kvbench.harness import eventloop
from kvbench.harness.bench_loadgen import single_turn_workload
from kvbench.harness.client import EndpointConfig
from kvbench.harness.loadgen import LoadGenerator
from kvbench.measure.schedule import LoadSpec
url, streams = sys.argv[1], int(sys.argv[2])
generator = LoadGenerator(EndpointConfig(url, "instrument"), LoadSpec(concurrency=streams), run_id="ab")
cpu = time.process_time()
records = eventloop.run(generator.run(single_turn_workload(4 * streams, max_tokens=8))).records
cpu_ms = (time.process_time() - cpu) * 1e3 / len(records)
ok = [r for r in records if r.ok and r.first_token_ns is not None]
errors = np.array([(r.first_token_ns - r.sent_ns) / 1e6 - %(first)s for r in ok])
span = (max(r.done_ns for r in ok) - min(r.sent_ns for r in ok)) / 1e9
print(json.dumps({"failed": len(records) - len(ok), "p50": float(np.percentile(errors, 50)),
                  "p99": float(np.percentile(errors, 99)), "req_s": len(ok) / span,
                  "cpu_ms": cpu_ms}))
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


METRICS = (
    ("p50", "TTFT error p50 ms", "{:.1f}"),
    ("p99", "p99 ms", "{:.1f}"),
    ("req_s", "req/s", "{:,.0f}"),
    ("cpu_ms", "CPU ms/req", "{:.3f}"),
)


def paired(results: dict, versions: list[str], streams: list[int], rounds: int) -> Table:
    """Each version against the first, round by round: median of the paired differences and their range."""
    reference = versions[0]
    table = Table(title=f"paired with {reference}, per round: median difference [range over {rounds} rounds]")
    for column in ("streams", "version", *(title for _, title, _ in METRICS)):
        table.add_column(column, justify="right")
    for count in streams:
        for name in versions:
            cells = []
            for key, _, shape in METRICS:
                mine = [results[(r, count, name)][key] for r in range(rounds)]
                if name == reference:
                    cells.append(shape.format(statistics.median(mine)))
                    continue
                base = [results[(r, count, reference)][key] for r in range(rounds)]
                diffs = [a - b for a, b in zip(mine, base, strict=True)]
                cells.append(
                    f"{shape.format(statistics.median(mine))} ({_signed(shape, statistics.median(diffs))} "
                    f"[{_signed(shape, min(diffs))}, {_signed(shape, max(diffs))}])"
                )
            table.add_row(str(count), name, *cells)
    return table


def _signed(shape: str, value: float) -> str:
    return ("+" if value >= 0 else "") + shape.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--versions",
        default="pre-checks=17896db,this=.",
        help="NAME=REF,... (REF a git ref, or . for this checkout); the first is the one the others are paired with",
    )
    parser.add_argument("--streams", default="100,1000")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--instrument-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    args = parser.parse_args()
    versions = [tuple(item.split("=", 1)) for item in args.versions.split(",")]
    streams = [int(value) for value in args.streams.split(",")]
    load_before = os.getloadavg()[0]
    results: dict[tuple[int, int, str], dict] = {}
    table = Table()
    for column in ("round", "streams", "version", *(title for _, title, _ in METRICS), "failed"):
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
                        results[(round_index, count, name)] = result
                        table.add_row(
                            str(round_index + 1),
                            str(count),
                            name,
                            *(shape.format(result[key]) for key, _, shape in METRICS),
                            str(result["failed"]),
                        )
        finally:
            instrument.kill()
    table.title = (
        f"client A/B against the instrument ({FIRST_TOKEN_MS:g} ms TTFT), alternated; instrument on core "
        f"{args.instrument_core}, client on core {args.client_core}; load average {load_before:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} CPUs"
    )
    console = Console(width=160)
    console.print(table)
    console.print(paired(results, [name for name, _ in versions], streams, args.rounds))


if __name__ == "__main__":
    main()
