"""The nightly gate's power: how often `kvbench compare` calls a known change, and how often it calls one that is
not there, per metric, at the nightly's run size.

    python benchmarks/gate_power.py [--rounds 6] [--changes 10] [--keep DIR]
    python benchmarks/gate_power.py --changes 5,10,20 --rounds 4
    python benchmarks/gate_power.py --judge DIR      # judge folders made before (e.g. by another checkout)

The run size is the nightly's own: the workload, load point, stop, repetitions and seed of ci/nightly-cpu.yaml
(`--config` for another), its engines replaced by one endpoint cell. Each arm is an instrument process of its
own (kvbench/harness/instrument.py, TTFT 40 ms, ITL 10 ms), started once and kept: the baseline, a twin of it
(identical flags, another process and port: the identical pairs), and one per injected change: TTFT +P%,
ITL +P%, answers P% shorter (a server never sends past max_tokens, so output length moves down). Every round
runs every arm once, in reverse order every other round, so a machine that gets busier or quieter during the
benchmark moves baseline and changed runs alike. Every baseline run is compared with every run of an arm
(rounds x rounds pairs). A change is "called" when the verdict is regression or improvement; on the twin's pairs
that is a false alarm. Prints one table, a row per arm and a column per metric: the share of pairs called and
the median minimum detectable effect the rows state; then the load average (`uptime`'s) before and after and
the minutes a nightly-size run took. `--judge` re-judges the folders of a `--keep DIR` with whatever kvbench is
imported (PYTHONPATH first). A benchmark (it prints a table), not a test; timings under load are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # PYTHONPATH's kvbench first (see --judge)

from kvbench.measure.run_folder import read_run_folder  # noqa: E402
from kvbench.verdicts.compare import CompareOptions, compare  # noqa: E402

METRICS = ("ttft_p50", "tpot_p50", "itl_p50", "e2e_p50", "output_tok_s")
NIGHTLY = ROOT / "ci" / "nightly-cpu.yaml"
BASE, TWIN = "baseline", "twin (identical)"
FIRST_TOKEN_MS, CHUNK_INTERVAL_MS = 40.0, 10.0


def arms(percents: list[float]) -> dict[str, tuple[float, float, float]]:
    """Arm name -> (first-token factor, inter-token factor, output share)."""
    table = {BASE: (1.0, 1.0, 1.0), TWIN: (1.0, 1.0, 1.0)}
    for p in percents:
        table[f"TTFT +{p:g}%"] = (1 + p / 100, 1.0, 1.0)
        table[f"ITL +{p:g}%"] = (1.0, 1 + p / 100, 1.0)
        table[f"output -{p:g}%"] = (1.0, 1.0, 1 - p / 100)
    return table


def nightly_config(path: Path) -> dict:
    """The nightly's matrix with its engines replaced by one endpoint cell (its url set per arm)."""
    data = yaml.safe_load(path.read_text())
    keep = ("name", "seed", "repeat", "workloads", "loads", "stop", "client")
    config = {key: data[key] for key in keep if key in data}
    config["engines"] = [{"engine": "endpoint", "label": "instrument", "settings": {"url": "URL"}}]
    return config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def instrument(ttft: float, itl: float, share: float) -> Iterator[str]:
    """An instrument in its own process (so the client under test does not share its interpreter)."""
    port = _free_port()
    flags = [f"--first-token-ms={FIRST_TOKEN_MS * ttft}", f"--chunk-interval-ms={CHUNK_INTERVAL_MS * itl}"]
    server = subprocess.Popen(
        [sys.executable, "-m", "kvbench.harness.instrument", "--port", str(port), *flags, f"--output-share={share}"]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("an instrument did not start")
            time.sleep(0.2)
        yield url
    finally:
        server.kill()
        server.wait()


def make_runs(root: Path, table: dict, config: dict, rounds: int) -> float:
    """Every arm once per round (reversed every other round); returns the mean seconds of one run."""
    from kvbench.cli.main import main

    durations = []
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(instrument(*factors)) for name, factors in table.items()}
        names = list(table)
        for round_ in range(rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                config["engines"][0]["settings"]["url"] = urls[name]
                path = root / f"a{names.index(name)}" / "config.yaml"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(yaml.safe_dump(config))
                out = path.parent / f"r{round_}"
                started = time.monotonic()
                code = main(["run", str(path), "--out", str(out), "--progress-every", "600"])
                durations.append(time.monotonic() - started)
                if code not in (0, 1) or not (out / "summary.json").exists():  # 1: a point invalid (client lag)
                    raise SystemExit(f"kvbench run exited {code} for {name} round {round_}")
    return float(np.mean(durations))


def judge(root: Path, names: list[str]) -> list[list]:
    folders = {
        name: [read_run_folder(path) for path in sorted((root / f"a{index}").glob("r*"))]
        for index, name in enumerate(names)
    }
    options = CompareOptions(metrics=METRICS)
    rows = []
    for name, runs in folders.items():
        if name == BASE:
            continue
        pairs = list(itertools.product(folders[BASE], runs))
        called = {metric: 0 for metric in METRICS}
        mdes: dict[str, list[float]] = {metric: [] for metric in METRICS}
        for base, new in pairs:
            for row in compare(base, new, options).rows:
                if row.metric in called:
                    called[row.metric] += row.verdict.value in ("regression", "improvement")
                    if row.mde is not None:
                        mdes[row.metric].append(row.mde)
        rows.append(
            [name, len(pairs)]
            + [
                f"{called[m] / len(pairs):.0%}" + (f" ({100 * np.median(mdes[m]):.0f}%)" if mdes[m] else "")
                for m in METRICS
            ]
        )
    return rows


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="runs per arm (default 6: 36 pairs per arm)")
    parser.add_argument("--changes", default="10", help="injected changes in percent, comma-separated (default 10)")
    parser.add_argument("--config", type=Path, default=NIGHTLY, help=f"the nightly config (default {NIGHTLY.name})")
    parser.add_argument("--keep", type=Path, help="make the run folders here and keep them (for --judge)")
    parser.add_argument("--judge", type=Path, help="only judge the folders a --keep made (same --changes)")
    args = parser.parse_args()
    table = arms([float(p) for p in args.changes.split(",")])
    config = nightly_config(args.config)
    load_before = os.getloadavg()
    started = time.monotonic()
    per_run_s = None
    if args.judge:
        root = args.judge
    else:
        root = args.keep or Path(tempfile.mkdtemp(prefix="gate-power-"))
        per_run_s = make_runs(root, table, config, args.rounds)
    made = time.monotonic() - started
    rows = judge(root, list(table))
    load_after = os.getloadavg()
    print(tabulate(rows, headers=["arm", "pairs", *METRICS]))
    print(
        f"share of pairs called a change (median minimum detectable effect the rows state); '{TWIN}': false "
        f"alarms. Size: {args.config.name}'s workloads {config['workloads']}, loads {config['loads']}, repeat "
        f"{config.get('repeat', 1)}. Load average before {load_before[0]:.1f} / after {load_after[0]:.1f} "
        f"(1-min; 5-min {load_after[1]:.1f}); "
        + (f"a nightly-size run took {per_run_s / 60:.2f} min; " if per_run_s else "")
        + f"runs made in {made / 60:.1f} min, judged in {(time.monotonic() - started - made) / 60:.1f} min"
    )


if __name__ == "__main__":
    main_bench()
