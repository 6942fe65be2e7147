"""False alarms of the nightly gate between identical real runs on this machine, as loaded as it is now.

    python benchmarks/gate_false_alarms.py [--runs 4] [--busy 2] [--first-token-ms 50]

Starts the measurement instrument (a fixed first-token delay, 2 ms between chunks), makes a baseline run of
rag-chat-mini (6 sessions, concurrency 3, 2 repetitions) against it, then `--runs` more identical runs, each
compared with the baseline by `kvbench compare`; prints, per run, compare's exit code and the metrics it called a
regression. Identical runs that alarm measure the machine (load moving between runs), not the gate: the gate's
false-alarm rate between draws of one distribution is a test on synthetic folders (tests/verdicts/test_compare.py).
`--busy N` starts N busy-looping processes for the duration. A benchmark (it prints a table), not a test.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvbench.cli.main import main  # noqa: E402
from kvbench.engines.http import request  # noqa: E402
from tests.harness.instrument_fixture import free_port  # noqa: E402


def busy() -> None:
    while True:
        pass


def run(out: Path, url: str) -> Path:
    code = main(
        [
            "run",
            "--workload",
            "rag-chat-mini",
            "--num-sessions",
            "6",
            "--concurrency",
            "3",
            "--repeat",
            "2",
            "--url",
            url,
            "--out",
            str(out),
        ]
    )
    if code != 0:
        raise SystemExit(f"kvbench run exited {code}")
    return out


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--first-token-ms", type=float, default=50.0)
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.busy)]
    for hog in hogs:
        hog.start()
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvbench.harness.instrument",
            "--port",
            str(port),
            "--first-token-ms",
            str(args.first_token_ms),
            "--chunk-interval-ms",
            "2",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not request("GET", url + "/health", timeout_s=1).ok:
            if time.monotonic() > deadline:
                raise SystemExit("the instrument did not start")
            time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            baseline = run(Path(tmp) / "base", url)
            rows = []
            for index in range(args.runs):
                new = run(Path(tmp) / f"again{index}", url)
                code = main(["compare", str(baseline), str(new), "--format", "csv", "--out", str(new / "compare.csv")])
                rows.append([index, code, ", ".join(_regressions(new / "compare.csv")) or "-"])
    finally:
        server.kill()
        for hog in hogs:
            hog.terminate()
    print(tabulate(rows, headers=["run", "compare exit", "regressions"]))
    print(f"false alarms: {sum(row[1] == 1 for row in rows)}/{len(rows)} identical runs (busy processes: {args.busy})")


def _regressions(path: Path) -> list[str]:
    if not path.exists():
        return []
    with path.open() as handle:
        return [row["metric"] for row in csv.DictReader(handle) if (row.get("verdict") or "").lower() == "regression"]


if __name__ == "__main__":
    main_bench()
