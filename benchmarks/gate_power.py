"""The nightly gate's power: how often `kvbench compare` calls a known change, and how often it calls one that is
not there, per metric, at the nightly's run size.

    python benchmarks/gate_power.py [--runs 4] [--sessions 8] [--concurrency 4] [--repeat 3] [--keep DIR]
    python benchmarks/gate_power.py --judge DIR      # judge folders made before (e.g. by another checkout)

Starts the measurement instrument (TTFT 40 ms, ITL 10 ms: kvbench/harness/instrument.py) in this process and
makes `--runs` run folders of rag-chat-mini (the nightly's sessions, concurrency and repetitions: ci/nightly-cpu.yaml)
per injected change: none, TTFT +5/+10/+20%, ITL +5/+10/+20%, and answers 5/10/20% shorter (a server never sends
past max_tokens, so output length moves down). Every baseline run is compared with every changed run (runs x runs
pairs) and every two baseline runs with each other (identical pairs). A change is "called" when the verdict is
regression or improvement; on identical pairs that is a false alarm. Prints one table: a row per change, a
column per metric, the share of pairs called, and the median minimum detectable effect the rows state.
`--judge` re-judges the folders of a `--keep DIR` with whatever kvbench is imported (PYTHONPATH first): the
same runs judged by two versions of the gate. A benchmark (it prints a table), not a test.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

sys.path.append(str(Path(__file__).resolve().parents[1]))  # PYTHONPATH's kvbench first (see --judge)

from kvbench.measure.run_folder import read_run_folder  # noqa: E402

try:
    from kvbench.verdicts.compare import CompareOptions, compare  # noqa: E402
except ImportError:  # a checkout from before kvbench/verdicts/
    from kvbench.harness.compare import CompareOptions, compare  # noqa: E402

METRICS = ("ttft_p50", "itl_p50", "tpot_p50", "e2e_p50", "output_tok_s")
BASE = "none"
# change name -> (first-token factor, inter-token factor, output share)
CHANGES = {
    BASE: (1.0, 1.0, 1.0),
    **{f"TTFT +{p}%": (1 + p / 100, 1.0, 1.0) for p in (5, 10, 20)},
    **{f"ITL +{p}%": (1.0, 1 + p / 100, 1.0) for p in (5, 10, 20)},
    **{f"output -{p}%": (1.0, 1.0, 1 - p / 100) for p in (5, 10, 20)},
}
FIRST_TOKEN_MS, CHUNK_INTERVAL_MS = 40.0, 10.0


def make_runs(root: Path, args: argparse.Namespace) -> None:
    from aiohttp import web

    from kvbench.cli.main import main
    from kvbench.harness.instrument import InstrumentBehaviour, InstrumentLog, make_app
    from tests.harness.instrument_fixture import app_in_thread

    for index, (change, (ttft, itl, share)) in enumerate(CHANGES.items()):
        behaviour = InstrumentBehaviour(
            first_token_ms=FIRST_TOKEN_MS * ttft, chunk_interval_ms=CHUNK_INTERVAL_MS * itl, output_share=share
        )
        runner = web.AppRunner(make_app(behaviour, InstrumentLog()), access_log=None, shutdown_timeout=0.5)
        with app_in_thread(runner) as url:  # a new port per change: the gate must not care
            for run in range(args.runs):
                out = root / f"c{index}" / f"r{run}"
                argv = [
                    "run",
                    "--workload",
                    "rag-chat-mini",
                    "--num-sessions",
                    str(args.sessions),
                    "--concurrency",
                    str(args.concurrency),
                    "--repeat",
                    str(args.repeat),
                    "--url",
                    url,
                    "--out",
                    str(out),
                    "--progress-every",
                    "600",
                    "--max-lag-ms",
                    "100",
                ]
                if main(argv) != 0:
                    raise SystemExit(f"kvbench run exited non-zero for {change} run {run}")


def judge(root: Path) -> list[list]:
    folders = {
        change: [read_run_folder(path) for path in sorted((root / f"c{index}").iterdir())]
        for index, change in enumerate(CHANGES)
    }
    options = CompareOptions(metrics=METRICS)
    table = []
    for change, runs in folders.items():
        pairs = (
            list(itertools.combinations(folders[BASE], 2))
            if change == BASE
            else list(itertools.product(folders[BASE], runs))
        )
        called = {metric: 0 for metric in METRICS}
        mdes: dict[str, list[float]] = {metric: [] for metric in METRICS}
        for base, new in pairs:
            for row in compare(base, new, options).rows:
                if row.metric in called:
                    called[row.metric] += row.verdict.value in ("regression", "improvement")
                    if getattr(row, "mde", None) is not None:
                        mdes[row.metric].append(row.mde)
        if not pairs:
            continue
        table.append(
            [change, len(pairs)]
            + [
                f"{called[metric] / len(pairs):.0%}"
                + (f" ({100 * np.median(mdes[metric]):.0f}%)" if mdes[metric] else "")
                for metric in METRICS
            ]
        )
    return table


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="run folders per change (default 4)")
    parser.add_argument("--sessions", type=int, default=8, help="rag-chat-mini sessions (nightly-cpu: 8)")
    parser.add_argument("--concurrency", type=int, default=4, help="nightly-cpu: 4")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per run (nightly-cpu: 3)")
    parser.add_argument("--keep", type=Path, help="make the run folders here and keep them (for --judge)")
    parser.add_argument("--judge", type=Path, help="only judge the folders a --keep made")
    args = parser.parse_args()
    started = time.monotonic()
    if args.judge:
        root = args.judge
    else:
        root = args.keep or Path(tempfile.mkdtemp(prefix="gate-power-"))
        make_runs(root, args)
    made = time.monotonic() - started
    table = judge(root)
    print(tabulate(table, headers=["change", "pairs", *METRICS]))
    print(
        f"share of pairs called a change (median MDE the rows state); row '{BASE}': false alarms on identical "
        f"pairs. {args.runs} runs per change, {args.sessions} sessions, concurrency {args.concurrency}, "
        f"{args.repeat} repetitions; runs made in {made / 60:.1f} min, judged in "
        f"{(time.monotonic() - started - made) / 60:.1f} min"
    )


if __name__ == "__main__":
    main_bench()
