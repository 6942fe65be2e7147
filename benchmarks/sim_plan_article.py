"""The article's four rows revisited with the planner: at what load and node count does each system reach the
article's TTFT p99?

    python benchmarks/sim_plan_article.py [--rates 2,4,8] [--sessions 600] [--think 30] [--max-nodes 16]

For each session arrival rate and each row (vllm-prefix 720 ms, sglang-radix 510, lmcache-local 430,
lmcache-shared 480), `kvbench plan`'s search finds the fewest 8xH200 nodes (Qwen2.5-72B, FP8 weights and KV,
rag-chat at the article's sizes: 1.5K system prompt, 8 x 1K documents, ~200-token turns, ~6 turns) whose
simulated TTFT p99 is at or under the article's figure for that row, with each preset's own routing across
nodes. Prints one row per (rate, system): the node counts tried with their TTFT p99, the answer, output tok/s
per node there (the article's in parentheses) and the planning time. The H200 efficiencies are assumptions
(printed); every simulated time scales with them.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.plan import SloTarget, plan_point, search_nodes
from kvbench.sim.presets import PRESETS
from kvbench.workloads.profiles import load_workload

ARTICLE = {  # TTFT p99 ms, output tok/s (one 8xH200 node)
    "vllm-prefix": (720, 2100),
    "sglang-radix": (510, 2650),
    "lmcache-local": (430, 2450),
    "lmcache-shared": (480, 2380),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="2,4,8", help="session arrival rates (sessions/s), comma-separated")
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--think", type=float, default=30.0, help="median think time between turns, seconds")
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--presets", default=",".join(ARTICLE), help="rows to plan, comma-separated")
    parser.add_argument(
        "--hardware",
        default="8xh200",
        help="node profile (a name, or a fitted .json: results/sim/published/llm-d-precise-prefix/"
        "8xh200-fitted.json carries the efficiencies fitted on llm-d's H100 case)",
    )
    args = parser.parse_args()
    geometry, hardware = load_geometry("qwen2.5-72b"), load_hardware(args.hardware)
    console = Console(width=200)
    console.print(
        hardware.assumptions(SimConfig(geometry, hardware, PRESETS["vllm-prefix"], "fp8", "fp8").cost.pricing)
    )
    table = Table(
        title=f"rag-chat, {args.sessions} sessions, think median {args.think:g} s, Qwen2.5-72B fp8 on "
        "8xH200 nodes: fewest nodes with TTFT p99 <= the article's"
    )
    for column in (
        "sessions/s",
        "system",
        "article p99 ms",
        "TTFT p99 ms by nodes tried",
        "nodes needed",
        "out tok/s per node (article)",
        "plan s",
    ):
        table.add_column(column, justify="right")
    for rate in [float(r) for r in args.rates.split(",")]:
        workload = load_workload(
            "rag-chat", num_sessions=args.sessions, overrides={"session_rate": rate, "think_time_median_s": args.think}
        )
        for name in args.presets.split(","):
            p99, tok = ARTICLE[name]
            started = time.perf_counter()
            config = SimConfig(geometry, hardware, PRESETS[name], "fp8", "fp8")
            targets = (SloTarget("ttft", "p99", float(p99)),)
            search = search_nodes(
                lambda n, c=config: plan_point(workload, LoadSpec(), c, n, targets), args.max_nodes, targets
            )
            tried = ", ".join(f"{p.nodes}: {p.values['ttft_p99_ms']:,.0f}" for p in search.points)
            at = next((p for p in search.points if p.nodes == search.answer), None)
            per_node = "-" if at is None or at.output_tok_s is None else f"{at.output_tok_s / at.nodes:,.0f}"
            table.add_row(
                f"{rate:g}",
                name,
                str(p99),
                tried,
                f"> {args.max_nodes}" if search.answer is None else str(search.answer),
                f"{per_node} ({tok})",
                f"{time.perf_counter() - started:.0f}",
            )
            for finding in search.non_monotone:
                console.print(f"non-monotone {name} at {rate:g}/s: {finding}")
            console.print(f"{rate:g}/s {name}: {tried} -> {search.answer}", highlight=False)
    console.print(table)


if __name__ == "__main__":
    main()
