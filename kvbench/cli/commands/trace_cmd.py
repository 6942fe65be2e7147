"""`kvbench trace stats FILE`: a trace's prefix reuse through the engine's own cache core."""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.table import Table

from kvbench.cli.flag_types import at_least
from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.workloads.profiles import load_workload

console = Console()


def register(commands, formatter) -> None:
    parser = commands.add_parser("trace", help="trace tools", formatter_class=formatter)
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    stats = actions.add_parser(
        "stats",
        help="prefix hit rates of a trace through our cache core",
        description="Replay a trace's prompts through the engine's page pool and prefix index: the unbounded "
        "prefix hit rate (prompt tokens in full pages sent earlier) and the hit rate of an LRU cache of each "
        "capacity.",
        formatter_class=formatter,
    )
    stats.add_argument("file", help="trace file (Mooncake JSONL, Azure CSV, kvbench JSONL)")
    stats.add_argument(
        "--cache-tokens",
        type=_capacities,
        default=(),
        help="comma-separated LRU capacities in tokens, e.g. 1000000,4000000",
    )
    stats.add_argument(
        "--page-size",
        type=at_least(1),
        default=DEFAULT_PAGE_SIZE,
        help=f"tokens per page (default {DEFAULT_PAGE_SIZE}, our engine's)",
    )
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(handler=handle_stats)


def handle_stats(args: argparse.Namespace) -> int:
    from kvbench.engines.kvengine.core.trace_replay import replay_prefix_hits

    started = time.perf_counter()
    workload = load_workload(args.file)
    prompts = (
        session.context if not session.turns[0].user_tokens.size else _prompt(session) for session in workload.sessions
    )
    stats = replay_prefix_hits(prompts, page_size=args.page_size, capacities_tokens=list(args.cache_tokens))
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps(stats.to_json()))
        return 0
    table = Table(title=f"{args.file} ({elapsed:.1f} s)")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("requests", str(stats.requests))
    table.add_row("prompt tokens", str(stats.prompt_tokens))
    table.add_row("unbounded prefix hit rate", _pct(stats.unbounded_token_hit_rate))
    for capacity, rate in stats.lru_token_hit_rate.items():
        table.add_row(f"LRU hit rate, {capacity:,} tokens", _pct(rate))
    console.print(table)
    return 0


def _capacities(text: str) -> tuple[int, ...]:
    """`1000000,4e6` -> (1000000, 4000000): each a token count >= 1."""
    counts = []
    for part in filter(None, (part.strip() for part in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            value = 0.0
        if not (value >= 1 and value.is_integer()):
            raise argparse.ArgumentTypeError(f"expected comma-separated token counts >= 1, got {part!r}")
        counts.append(int(value))
    return tuple(counts)


def _prompt(session):
    import numpy as np

    return np.concatenate([session.context, session.turns[0].user_tokens])


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.2f}%"
