"""`kvbench workload NAME|PATH --stats`: what a workload asks for, without running it."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from kvbench.cli.flag_types import at_least
from kvbench.workloads.profiles import load_workload
from kvbench.workloads.stats import workload_stats

console = Console()


def register(commands, formatter) -> None:
    parser = commands.add_parser(
        "workload",
        help="describe a workload (sessions, turns, tokens, oracle hit rate)",
        description="Describe a workload without running it. The oracle hit rate uses placeholder answers "
        "(the real answers are unknown before a run).",
        formatter_class=formatter,
    )
    parser.add_argument("workload", metavar="NAME|PATH", help="profile name, trace file or parameter YAML")
    parser.add_argument("--stats", action="store_true", help="print statistics (the default action)")
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--num-sessions", type=at_least(1))
    parser.add_argument("--vocab-size", type=at_least(2))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    workload = load_workload(args.workload, seed=args.seed, num_sessions=args.num_sessions, vocab_size=args.vocab_size)
    stats = workload_stats(workload)
    data = stats.to_dict()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    table = Table(title=f"workload {stats.name}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("sessions", str(stats.sessions))
    table.add_row("requests (turns)", str(stats.requests))
    table.add_row("tenants", str(stats.tenants))
    table.add_row("duration of arrivals (s)", f"{stats.duration_s:.1f}")
    for label, counts in (("prompt tokens", stats.prompt_tokens), ("output tokens", stats.output_tokens)):
        if counts is not None:
            table.add_row(
                label, f"mean {counts.mean:.0f}  p50 {counts.p50:.0f}  p90 {counts.p90:.0f}  max {counts.max:.0f}"
            )
    table.add_row("prompt tokens, total", str(stats.prompt_tokens_total))
    table.add_row("reusable tokens (unbounded cache)", str(stats.reusable_tokens_total))
    rate = stats.oracle_hit_rate
    table.add_row("oracle hit rate", "n/a" if rate is None else f"{100 * rate:.1f}%")
    console.print(table)
    if len(stats.per_tenant) > 1:
        tenants = Table(title="per tenant")
        for column in ("tenant", "sessions", "requests", "prompt tokens", "oracle hit rate"):
            tenants.add_column(column)
        for tenant in stats.per_tenant:
            hit = tenant.oracle_hit_rate
            tenants.add_row(
                tenant.tenant,
                str(tenant.sessions),
                str(tenant.requests),
                str(tenant.prompt_tokens_total),
                "n/a" if hit is None else f"{100 * hit:.1f}%",
            )
        console.print(tenants)
    return 0
