"""`kvbench run ... --find-max request-rate|concurrency --slo ttft_p99_ms=500`: the highest load meeting every
SLO, searched by real runs (harness/find_max.py), every probe printed as it ends and in a table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from kvbench.settings import SettingsError


def _slo(text: str):
    from kvbench.sim.plan import parse_slo

    try:
        return parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SLA search (real runs; kvbench plan runs the same search in simulation)")
    group.add_argument(
        "--find-max",
        choices=("request-rate", "concurrency"),
        help="search the highest request rate (or concurrency) that meets every --slo target: one "
        "real run per probe (engine started and cache reset for each), doubling then bisecting; "
        "starts at --request-rate / --concurrency (default 1)",
    )
    group.add_argument(
        "--slo",
        type=_slo,
        metavar="TARGETS",
        help="targets for --find-max, e.g. ttft_p99_ms=500,tpot_p50_ms=50 (kvbench plan's syntax)",
    )
    group.add_argument("--max-probes", type=int, default=10, help="--find-max: at most this many probes (default 10)")
    group.add_argument(
        "--rate-tolerance",
        type=float,
        default=0.1,
        help="--find-max request-rate: stop when the miss is within this fraction of the answer",
    )


def run(args: argparse.Namespace, config, run_dir: Path, console: Console) -> int:
    from kvbench.harness.find_max import CONCURRENCY, FIND_MAX_JSON, find_max

    if not args.slo:
        raise SettingsError("--find-max needs --slo, e.g. --slo ttft_p99_ms=500")
    if args.max_probes < 2:
        raise SettingsError(f"--max-probes must be >= 2, got {args.max_probes}")
    start = (args.concurrency if args.find_max == CONCURRENCY else args.request_rate) or 1
    unit = "" if args.find_max == CONCURRENCY else " req/s"
    console.print(f"[bold]kvbench run --find-max {args.find_max}[/bold] -> {run_dir}")

    def said(probe) -> None:
        values = ", ".join(
            f"{name} {'n/a' if value is None else f'{value:,.1f}'}" for name, value in probe.values.items()
        )
        console.print(
            f"probe {args.find_max} {probe.load:g}{unit}: {values}: {_verdict(probe)}"
            + (f" ({'; '.join(probe.invalid_reasons)})" if probe.invalid_reasons else ""),
            highlight=False,
        )

    try:
        search = find_max(
            config, args.find_max, args.slo, run_dir, float(start), args.max_probes, args.rate_tolerance, on_probe=said
        )
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    _print_probes(console, args, search)
    _print_answer(console, args, search, unit)
    console.print(f"results: {run_dir / FIND_MAX_JSON}, one run folder per probe under {run_dir / 'probes'}")
    return 0 if search.answer is not None else 1


def _print_probes(console: Console, args: argparse.Namespace, search) -> None:
    """Every probe, by load: its SLO metrics, requests, errors, verdict and run folder."""
    from kvbench.cli.console_table import Column, print_table

    names = [target.name for target in args.slo]
    columns = [
        Column(args.find_max, True),
        *(Column(name, True) for name in names),
        Column("requests", True),
        Column("errors", True),
        Column("verdict", False),
        Column("run folder", False),
    ]
    rows = [
        [
            f"{probe.load:g}",
            *(_ms(probe.values[name]) for name in names),
            str(probe.requests),
            str(probe.errors),
            _verdict(probe),
            escape(Path(probe.run_dir).name),
        ]
        for probe in sorted(search.probes, key=lambda probe: probe.load)
    ]
    print_table(console, columns, rows, title=f"probes ({', '.join(f'{t.name} <= {t.limit_ms:g}' for t in args.slo)})")


def _print_answer(console: Console, args: argparse.Namespace, search, unit: str) -> None:
    """What the search found: the highest load meeting the SLO with its interval, or why there is none."""
    for finding in search.non_monotone:
        console.print(f"[yellow]non-monotone: {escape(finding)}[/yellow]")
    if search.capped:
        console.print(f"[yellow]{escape(search.capped)}[/yellow]")
    if search.client_bound:
        console.print(
            f"[bold red]client-bound: no {args.find_max} tried could be measured[/bold red] (the client's "
            "own lag passed its bound on every probe that did not miss; the engine was not found wanting: "
            "give the client a core of its own, more --workers, or a looser --max-lag-ms)"
        )
    elif search.answer is None:
        console.print(
            f"[bold red]no {args.find_max} tried meets the SLO[/bold red] (lowest tried "
            f"{min(p.load for p in search.probes):g}{unit})"
        )
    else:
        upper = f"{search.missed_at:g}{unit} misses" if search.missed_at is not None else "no miss found above it"
        console.print(
            f"[bold]highest {args.find_max} meeting the SLO: {search.answer:g}{unit}[/bold] "
            f"(interval [{search.answer:g}, {'inf' if search.missed_at is None else f'{search.missed_at:g}'}); "
            f"{upper}; {len(search.probes)} probes)",
            highlight=False,
        )


def _verdict(probe) -> str:
    return "meets" if probe.meets else "client-bound" if probe.client_bound else "misses"


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"
