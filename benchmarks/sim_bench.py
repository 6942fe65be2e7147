"""Simulator speed: simulate vs `kvbench trace stats` on the same trace, and the results of each KV dtype.

    python benchmarks/sim_bench.py [--trace PATH] [--model qwen2.5-72b] [--preset vllm-prefix]
                                   [--baseline DIR] [--results]

Speed table (the issue 19 target: simulating one preset takes <= 3x the time of `trace stats`): for each trace
(the shipped Mooncake synthetic trace, and a generated 12,000-request Mooncake-style conversation trace with
~12K-token prompts, modelled on the FAST'25 conversation trace's published shape: 12,031 requests, mean input
12,035, mean output 343, one hour; the real file is not shipped), the wall time of `kvbench trace stats` and of
simulating it (fp8 KV), each in its own process, one after the other, so both sides run under the same load on
a shared machine: the ratio is the number to read, not the seconds, and CPU seconds more than wall seconds. With `--baseline DIR` (a checkout of an
older kvbench, e.g. `git archive ae4c19f | tar -x -C DIR`) the older simulator runs too, and the SHA-256 of
each record stream is compared: an optimisation must leave it identical.
`--results` adds the old table: one row per KV dtype with TTFT, throughput and hit rates.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
MOONCAKE_BLOCK = 512

# Run in a fresh process with PYTHONPATH pointing at the kvbench to time: prints one JSON line.
SIMULATE = """
import hashlib, json, sys
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload
import time
trace, model, hardware, preset, kv = sys.argv[1:6]
started = time.perf_counter()
workload = load_workload(trace)
config = SimConfig(load_geometry(model), load_hardware(hardware), get_preset(preset), kv, "fp8")
result = simulate(workload, LoadSpec(), config)
import kvbench.measure.records as records_module
lines = getattr(records_module, "jsonl_lines", None)  # what `kvbench simulate` writes with; older: to_json
digest = hashlib.sha256()
for line in (lines(result.records) if lines else (r.to_json() for r in result.records)):
    digest.update(line.encode()); digest.update(b"\\n")
print(json.dumps({"wall_s": time.perf_counter() - started, "sim_s": result.wall_s, "requests": len(result.records),
                  "steps": sum(n["steps"] for n in result.nodes), "digest": digest.hexdigest()}))
"""


def conversation_trace(path: Path, requests: int = 12000, seed: int = 0, duration_s: float = 3600.0) -> Path:
    """A Mooncake JSONL trace of multi-turn conversations: 60% of requests continue an open conversation (its
    prompt plus ~800 new tokens, reusing its full 512-token blocks), the rest start one (lognormal length,
    median ~7K tokens); uniform arrivals over `duration_s`. Deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0, duration_s * 1000, requests)).astype(int)
    open_talks: list[tuple[list[int], int]] = []
    next_id = 0
    with open(path, "w") as out:
        for t in times:
            if open_talks and rng.random() < 0.6:
                k = int(rng.integers(len(open_talks)))
                ids, previous = open_talks[k]
                length = previous + int(rng.lognormal(np.log(800), 0.8)) + 1
                full = previous // MOONCAKE_BLOCK  # the previous prompt's full blocks are reused
                new = -(-length // MOONCAKE_BLOCK) - full
                ids = ids[:full] + list(range(next_id, next_id + new))
                next_id += new
                if length > 120_000 or rng.random() < 0.15:
                    open_talks.pop(k)
                else:
                    open_talks[k] = (ids, length)
            else:
                length = min(int(rng.lognormal(np.log(12035 * 0.6), 0.9)) + 1, 120_000)
                blocks = -(-length // MOONCAKE_BLOCK)
                ids = list(range(next_id, next_id + blocks))
                next_id += blocks
                open_talks.append((ids, length))
                if len(open_talks) > 400:
                    open_talks.pop(0)
            output = int(rng.lognormal(np.log(343 * 0.6), 0.9)) + 1
            out.write(
                json.dumps({"timestamp": int(t), "input_length": length, "output_length": output, "hash_ids": ids})
                + "\n"
            )
    return path


def timed(argv: list[str], pythonpath: Path) -> tuple[float, float, str]:
    """Run `argv` with `pythonpath`: (wall seconds, CPU seconds of the child, its stdout). On a loaded machine
    the CPU seconds are the fair measure: wall time also counts the time other processes held the cores."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_WAIT_POLICY": "PASSIVE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # In `pythonpath`: `python -c` and `-m` put the working directory first on sys.path, ahead of PYTHONPATH,
    # so run from a checkout's root the "baseline" imported that checkout instead of the baseline.
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, cwd=pythonpath).stdout
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def speed_rows(trace: Path, args: argparse.Namespace) -> list[list[str]]:
    stats_wall, stats_cpu, _ = timed(
        [sys.executable, "-m", "kvbench.cli.main", "trace", "stats", str(trace), "--json"], ROOT
    )
    sides = [("now", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    runs = {}
    for name, path in sides:
        wall, cpu, out = timed(
            [sys.executable, "-c", SIMULATE, str(trace), args.model, args.hardware, args.preset, "fp8"], path
        )
        runs[name] = (wall, cpu, json.loads(out.strip().splitlines()[-1]))
    rows = []
    for name, (wall, cpu, result) in runs.items():
        same = "-" if "baseline" not in runs else ("yes" if result["digest"] == runs["baseline"][2]["digest"] else "NO")
        rows.append(
            [
                trace.name,
                name,
                f"{result['requests']:,}",
                f"{result['steps']:,}",
                f"{stats_cpu:.1f} ({stats_wall:.1f})",
                f"{cpu:.1f} ({wall:.1f})",
                f"{result['sim_s']:.1f}",
                f"{cpu / stats_cpu:.1f}x",
                f"{wall / stats_wall:.1f}x",
                same,
                result["digest"][:12],
            ]
        )
    return rows


def results_table(trace: Path, args: argparse.Namespace) -> Table:
    from kvbench.measure.metrics import summarize_run
    from kvbench.measure.schedule import LoadSpec
    from kvbench.sim.engine import SimConfig, simulate
    from kvbench.sim.geometry import load_geometry
    from kvbench.sim.hardware import load_hardware
    from kvbench.sim.presets import get_preset
    from kvbench.workloads.profiles import load_workload

    workload = load_workload(str(trace))
    table = Table(
        title=f"{trace.name} ({workload.num_requests} requests) on {args.hardware}, {args.model}, {args.preset}"
    )
    for column in (
        "kv",
        "device pages",
        "virtual s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "out tok/s",
        "hit rate",
        "oracle hit",
        "recompute",
        "steps",
        "sim wall s",
    ):
        table.add_column(column, justify="right")
    for kv in ("fp16", "fp8"):
        config = SimConfig(load_geometry(args.model), load_hardware(args.hardware), get_preset(args.preset), kv, "fp8")
        result = simulate(workload, LoadSpec(), config)
        s = summarize_run(result.records).overall
        table.add_row(
            kv,
            f"{result.device_pages:,}",
            f"{result.virtual_s:,.0f}",
            f"{s.ttft_ms.p50:,.0f}",
            f"{s.ttft_ms.p99:,.0f}",
            f"{s.output_tok_s:,.0f}",
            f"{s.cache.cache_hit_rate:.1%}",
            f"{s.cache.oracle_hit_rate:.1%}",
            f"{s.cache.prefill_recompute_rate:.1%}",
            f"{sum(n['steps'] for n in result.nodes):,}",
            f"{result.wall_s:.1f}",
        )
        del result  # a live result's ~600k chunk lists make every GC of the next simulation walk them
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=[],
        help="trace(s) to time (default: the shipped synthetic trace and the generated 12K one)",
    )
    parser.add_argument("--model", default="qwen2.5-72b")
    parser.add_argument("--hardware", default="8xh200")
    parser.add_argument("--preset", default="vllm-prefix")
    parser.add_argument("--baseline", type=Path, help="a checkout of an older kvbench to time (and compare) too")
    parser.add_argument(
        "--rounds", type=int, default=1, help="time each trace this many times, the sides alternated in each"
    )
    parser.add_argument("--results", action="store_true", help="also print TTFT/throughput/hit rates per KV dtype")
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/kvbench-sim-bench"), help="where the trace is generated"
    )
    args = parser.parse_args()
    traces = args.trace
    if not traces:
        args.work.mkdir(parents=True, exist_ok=True)
        generated = args.work / "conversation-12k.jsonl"
        if not generated.is_file():
            conversation_trace(generated)
        traces = [TRACE, generated]
    console = Console(width=250)
    load = os.getloadavg()
    table = Table(
        title=f"simulate ({args.preset}, {args.model}, {args.hardware}, fp8 KV) vs `kvbench trace stats`, "
        f"each in a fresh process; load average at start {load[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for column in (
        "trace",
        "simulator",
        "requests",
        "steps",
        "trace stats CPU s (wall)",
        "simulate CPU s (wall)",
        "of it simulating, wall s",
        "ratio CPU",
        "ratio wall",
        "same records",
        "records sha256",
    ):
        table.add_column(column, justify="right")
    for trace in traces:
        for _ in range(args.rounds):
            for row in speed_rows(trace, args):
                table.add_row(*row)
    console.print(table)
    console.print(
        "ratio = the simulating process (load the trace + simulate) over the trace stats process, by "
        f"CPU seconds and by wall seconds; load average at the end {os.getloadavg()[0]:.1f}"
    )
    if args.results:
        for trace in traces:
            console.print(results_table(trace, args))


if __name__ == "__main__":
    main()
