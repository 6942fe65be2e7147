"""Simulator speed and results on the whole Mooncake synthetic trace at 8xH200, FP16 vs FP8 KV.

    python benchmarks/sim_bench.py [--trace PATH] [--model qwen2.5-72b] [--preset vllm-prefix]

Prints one row per KV dtype: requests, prompt tokens, device KV pages, virtual duration, TTFT p50/p99,
output tok/s, cache hit rate, prefill recomputation and the wall time of the simulation (target: < 10 s).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvbench.measure.metrics import summarize_run
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload
from kvbench.workloads.spec import Workload

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--model", default="qwen2.5-72b")
    parser.add_argument("--hardware", default="8xh200")
    parser.add_argument("--preset", default="vllm-prefix")
    args = parser.parse_args()
    t0 = time.perf_counter()
    workload = load_workload(str(args.trace))
    load_s = time.perf_counter() - t0
    table = Table(title=f"{args.trace.name} ({workload.num_requests} requests, loaded in {load_s:.1f} s) on "
                  f"{args.hardware}, {args.model}, {args.preset}")
    for column in ("kv", "device pages", "virtual s", "TTFT p50 ms", "TTFT p99 ms", "out tok/s", "hit rate",
                   "oracle hit", "recompute", "steps", "sim wall s"):
        table.add_column(column, justify="right")
    for kv in ("fp16", "fp8"):
        table.add_row(*row(workload, args, kv))
    Console().print(table)


def row(workload: Workload, args: argparse.Namespace, kv: str) -> list[str]:
    """Simulate one KV dtype and format its row. A function of its own so that this run's result is garbage
    before the next run starts: a live result (~600k per-token chunk lists) makes every full GC of the next
    simulation walk it, which cost the second dtype more than a second of its wall time."""
    config = SimConfig(load_geometry(args.model), load_hardware(args.hardware), get_preset(args.preset), kv, "fp8")
    result = simulate(workload, LoadSpec(), config)
    s = summarize_run(result.records).overall
    return [kv, f"{result.device_pages:,}", f"{result.virtual_s:,.0f}", f"{s.ttft_ms.p50:,.0f}",
            f"{s.ttft_ms.p99:,.0f}", f"{s.output_tok_s:,.0f}", f"{s.cache.cache_hit_rate:.1%}",
            f"{s.cache.oracle_hit_rate:.1%}", f"{s.cache.prefill_recompute_rate:.1%}",
            f"{sum(n['steps'] for n in result.nodes):,}", f"{result.wall_s:.1f}"]


if __name__ == "__main__":
    main()
