"""The client's timing overhead against the measurement instrument: how far measured TTFT, ITL and send times lie
from the injected ones, per request and as a median, on this machine as loaded as it is now.

    python benchmarks/timing_overhead.py [--rounds 20] [--busy 2]

Each round replays the timing tests' workload (4 sessions x 3 turns, 4 tokens each, concurrency 4) against the
instrument served in this process (as tests/harness/test_workers.py and test_loadgen.py do) with 30 ms to the
first token and 5 ms between chunks, and an open-loop round (12 sessions at 40/s, 300 ms answers) for send lag.
`--workers N` plays the closed rounds on N load worker processes (test_workers.py's two-worker run, whose timing is
measured here, not asserted there). `--busy N` starts N busy-looping processes for the duration (the CI machine's 2 cores shared with other work).
It prints, over the rounds, the worst and the 99th percentile of: the round's median TTFT minus 30 ms, the median
ITL minus 5 ms, each request's TTFT minus 30 ms (the per-request overhead), and each send's lateness. These are
what tests/harness/timing.py's bounds are derived from. A benchmark (it prints a table), not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvbench.harness.client import EndpointConfig  # noqa: E402
from kvbench.harness.instrument import InstrumentBehaviour  # noqa: E402
from kvbench.harness.loadgen import LoadGenerator  # noqa: E402
from kvbench.harness.workers import run_on_workers  # noqa: E402
from kvbench.measure.metrics import itl_ms, summarize, ttft_ms  # noqa: E402
from kvbench.measure.schedule import LoadSpec, session_offsets  # noqa: E402
from tests.harness.instrument_fixture import serving  # noqa: E402
from tests.harness.test_loadgen import workload  # noqa: E402

TTFT_MS, CHUNK_MS = 30.0, 5.0


def busy() -> None:
    while True:
        pass


async def closed_round(workers: int = 1) -> tuple[float, float, list[float], list[float]]:
    behaviour = InstrumentBehaviour(first_token_ms=TTFT_MS, chunk_interval_ms=CHUNK_MS, first_token_id=700)
    wl = workload(sessions=4, turns=3, max_tokens=4, think=0.01)
    async with serving(behaviour) as (url, _):
        generator = LoadGenerator(EndpointConfig(base_url=url, model="m"), LoadSpec(concurrency=4), run_id="bench")
        if workers == 1:
            result = await generator.run(wl)
        else:  # the load worker processes (`kvbench run --workers N`), the instrument in this process
            result = await asyncio.to_thread(run_on_workers, generator, wl, workers, None, None)
    summary = summarize(result.records)
    ttfts = [ttft_ms(rec) - TTFT_MS for rec in result.records]
    gaps = [gap - CHUNK_MS for rec in result.records for gap in itl_ms(rec)]
    return summary.ttft_ms.p50 - TTFT_MS, summary.itl_ms.p50 - CHUNK_MS, ttfts, gaps


async def open_round() -> list[float]:
    load = LoadSpec(rate=40.0)
    async with serving(InstrumentBehaviour(first_token_ms=300, chunk_interval_ms=5)) as (url, _):
        result = await LoadGenerator(EndpointConfig(base_url=url, model="m"), load, run_id="bench").run(
            workload(sessions=12, max_tokens=3)
        )
    offsets = sorted(session_offsets(load, [0.0] * 12, seed=0))
    sent = sorted(rec.sent_ns for rec in result.records)
    return [abs((t - sent[0]) / 1e6 - 1e3 * planned) for t, planned in zip(sent, offsets)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--busy", type=int, default=0, help="busy-looping processes beside the rounds")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="closed rounds on N load worker processes (tests/harness/test_workers.py's two-worker run)",
    )
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.busy)]
    for hog in hogs:
        hog.start()
    try:
        medians, itls, ttfts, gaps, sends = [], [], [], [], []
        for _ in range(args.rounds):
            median, itl, per_request, per_gap = asyncio.run(closed_round(args.workers))
            medians.append(median)
            itls.append(itl)
            ttfts += per_request
            gaps += per_gap
            sends += asyncio.run(open_round())
    finally:
        for hog in hogs:
            hog.terminate()
    print(
        f"{args.rounds} rounds, {args.workers} load worker(s), {args.busy} busy process(es) beside them; "
        "overhead in ms (measured - injected)"
    )
    print(f"{'quantity':<36} {'min':>8} {'p50':>8} {'p99':>8} {'max':>8}")
    for name, values in (
        ("median TTFT of a round", medians),
        ("median ITL of a round", itls),
        ("one request's TTFT", ttfts),
        ("one ITL gap", gaps),
        ("one send's |lateness|", sends),
    ):
        v = np.asarray(values)
        print(f"{name:<36} {v.min():8.2f} {np.percentile(v, 50):8.2f} {np.percentile(v, 99):8.2f} {v.max():8.2f}")


if __name__ == "__main__":
    main()
