"""The flags of `vllm bench serve` that `kvbench run` speaks too, parsed as vLLM parses them.

- `--request-rate R`: requests per second (default: none; vLLM's default `inf` sends each request when it is
  ready), Poisson, or gamma with `--burstiness` (shape; 1.0 = Poisson), as vLLM draws them.
- `--max-concurrency C`: at most C requests in flight; a cap that combines with `--request-rate` or `--rate`.
- `--goodput ttft:MS tpot:MS e2el:MS`: goodput SLOs in milliseconds (vLLM's `KEY:VALUE` pairs, separated by
  spaces; commas also separate them here).
- `--percentile-metrics ttft,tpot,itl,e2el` and `--metric-percentiles 50,99`: which metrics' percentiles the
  console table shows (vLLM's defaults: ttft,tpot,itl at 99; the table adds their median, as vLLM's console).
  Any 0 < p < 100, as vLLM: 50, 90, 95 and 99 are in every summary, others are computed from the per-request
  export (measure/extra_percentiles.py).
"""

from __future__ import annotations

import argparse
import math

from kvbench.cli.flag_types import at_least
from kvbench.measure.extra_percentiles import percentile_column
from kvbench.measure.schedule import MAX_CONCURRENCY, MAX_RATE
from kvbench.settings import SettingsError

# vLLM's goodput metric names -> kvbench's SLO fields.
GOODPUT_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}
GOODPUT_NAMES = {field: name for name, field in GOODPUT_KEYS.items()}
# vLLM's percentile metric names -> kvbench's summary metrics.
PERCENTILE_METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
DEFAULT_METRIC_PERCENTILES = (99.0,)
# The table without --metric-percentiles: the median and vLLM's default p99, as vLLM's console prints them.
TABLE_PERCENTILES = (50.0, *DEFAULT_METRIC_PERCENTILES)


def request_rate(text: str) -> float:
    """A request rate: a number in (0, MAX_RATE], or `inf` (every request as soon as it is ready); 1e400 is not
    inf (float() makes it so), it is refused."""
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"must be a number > 0 and <= {MAX_RATE:g} (requests/s) or inf, got {text[:40]!r}"
        )
    return value


def goodput_pair(text: str) -> dict[str, float]:
    """`ttft:500` (or `ttft:500,tpot:50`) as {slo field: milliseconds}; a key given twice is refused."""
    slo = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = pair.partition(":")
        if not sep or name not in GOODPUT_KEYS:
            raise argparse.ArgumentTypeError(
                f"expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)} (e.g. ttft:500), got {pair[:40]!r}"
            )
        if GOODPUT_KEYS[name] in slo:
            raise argparse.ArgumentTypeError(f"{name} is given twice; give each key once")
        try:
            limit = float(value)
        except ValueError:
            limit = math.nan
        if not (math.isfinite(limit) and limit >= 0):
            raise argparse.ArgumentTypeError(f"{name}: expected milliseconds >= 0, got {value!r}")
        slo[GOODPUT_KEYS[name]] = limit
    return slo


def metric_names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in PERCENTILE_METRICS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(PERCENTILE_METRICS)}, got {text!r}"
        )
    return names


def percentiles(text: str) -> tuple[float, ...]:
    values = []
    for part in filter(None, (part.strip() for part in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not 0 < value < 100:
            raise argparse.ArgumentTypeError(
                f"each percentile must be a number between 0 and 100 (exclusive), e.g. 50,90,99.9; got {part!r}"
            )
        values.append(value)
    if not values:
        raise argparse.ArgumentTypeError(f"expected percentiles, e.g. 50,90,99, got {text!r}")
    return tuple(values)


def add_load_flags(load: argparse._MutuallyExclusiveGroup, parser: argparse.ArgumentParser) -> None:
    """vLLM's load flags: `--request-rate` beside our `--rate`/`--concurrency` (one of them), and the cap."""
    load.add_argument(
        "--request-rate",
        type=request_rate,
        metavar="R",
        help="open loop: requests per second, Poisson (gamma with --burstiness), as vLLM's "
        "--request-rate; each arrival sends the next ready request, a session's next turn first; "
        "inf sends every request as soon as it is ready",
    )
    parser.add_argument(
        "--max-concurrency",
        type=at_least(1, MAX_CONCURRENCY),
        metavar="C",
        help="at most C requests in flight, a cap that combines with --request-rate or --rate (as "
        "vLLM's); requests past it wait, and TTFT from schedule counts the wait",
    )


def add_report_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--goodput",
        nargs="+",
        type=goodput_pair,
        metavar="KEY:MS",
        help="goodput SLOs as vLLM's: ttft:MS tpot:MS e2el:MS (spaces or commas between); the "
        "table and summary.md show goodput req/s and the share of requests meeting them",
    )
    parser.add_argument(
        "--percentile-metrics",
        type=metric_names,
        metavar="LIST",
        help=f"metrics whose percentiles the table shows: {','.join(PERCENTILE_METRICS)} "
        f"(default {','.join(DEFAULT_PERCENTILE_METRICS)}, as vLLM)",
    )
    parser.add_argument(
        "--metric-percentiles",
        type=percentiles,
        metavar="LIST",
        help="percentiles shown for them, any 0 < p < 100 (default 99, as vLLM; the table then shows "
        "the median beside it, as vLLM's console does); 50, 90, 95 and 99 are in summary.json, "
        "others come from requests_metrics.jsonl",
    )


def goodput_slo(args: argparse.Namespace) -> dict[str, float]:
    """The SLO fields `--goodput` sets; SettingsError for a key given twice (`--goodput ttft:5 ttft:7`: which
    one was meant?)."""
    slo: dict[str, float] = {}
    for pairs in args.goodput or ():
        twice = [GOODPUT_NAMES[field] for field in pairs if field in slo]
        if twice:
            raise SettingsError(f"--goodput: {', '.join(twice)} is given twice; give each key once")
        slo.update(pairs)
    return slo


def load_point(args: argparse.Namespace) -> dict | None:
    """The load point vLLM's flags ask for, or None when they ask for none; `--max-concurrency` with a closed
    loop is refused (that cap is `--concurrency` itself)."""
    cap = {"max_concurrency": args.max_concurrency} if args.max_concurrency is not None else {}
    if args.max_concurrency is not None and args.concurrency is not None:
        raise SettingsError(
            "--max-concurrency caps an open loop (--request-rate or --rate); --concurrency is a "
            "closed loop's cap already: give one of them"
        )
    if args.request_rate is not None:
        rate = "inf" if math.isinf(args.request_rate) else args.request_rate
        return {"request_rate": rate, "burstiness": args.burstiness, **cap}
    if args.rate is not None:
        return {"rate": args.rate, "burstiness": args.burstiness, **cap}
    if args.max_concurrency is not None and not args.trace_times:
        return {"request_rate": "inf", **cap}  # vLLM: --max-concurrency alone, every request as soon as a slot frees
    if args.trace_times and cap:
        return cap
    return None


def percentile_columns(args: argparse.Namespace) -> dict[str, str]:
    """Summary-frame column -> table title for the percentiles the flags select, e.g. ttft_p99_ms: TTFT p99 ms."""
    names = args.percentile_metrics or DEFAULT_PERCENTILE_METRICS
    shown = args.metric_percentiles or TABLE_PERCENTILES
    return {
        percentile_column(PERCENTILE_METRICS[name], p): f"{name.upper()} p{p:g} ms" for name in names for p in shown
    }
