"""Progress while a point runs: off a terminal, a plain line every N seconds with the count, running TTFT p50,
request rate and ETA (rich alone prints nothing there until the point ends)."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console
from rich.progress import Progress

from kvbench.cli.live_progress import live_progress
from kvbench.measure.metrics import SLO
from kvbench.measure.records import PointId, RequestRecord
from kvbench.measure.run_folder import RunEntry

MS = 1_000_000


def _record(index, ttft_ms, error=None):
    return RequestRecord(
        run_id="p",
        request_id=f"q{index}",
        session_id=f"s{index}",
        tenant="t",
        turn=0,
        queued_ns=0,
        sent_ns=0,
        first_token_ns=ttft_ms * MS,
        done_ns=(ttft_ms + 5) * MS,
        error=error,
    )


def test_off_a_terminal_a_line_every_n_seconds_with_ttft_rate_and_eta():
    out = io.StringIO()
    now = {"t": 100.0}
    with Progress(console=Console(file=out, force_terminal=False, width=120)) as bar:
        progress = live_progress(bar, every_s=10.0, clock=lambda: now["t"])
        progress.on_point_start("p", 8)
        for index, ttft in enumerate([20, 40, 60, 80]):
            now["t"] += 3.0  # a request every 3 s: lines at 12 s (4th request), none before 10 s
            progress.on_record(_record(index, ttft, error="http: 500" if index == 1 else None))
    lines = [line for line in out.getvalue().splitlines() if line.startswith("p: ")]
    assert lines == ["p: 4/8 requests, errors 1, TTFT p50 60 ms, 0.33 req/s, 12 s, ETA 12 s"]


def test_off_a_terminal_each_point_ends_with_one_unwrapped_line():
    """A narrow log console (40 columns) still gets each line whole: a log's reader greps it."""
    out = io.StringIO()
    now = {"t": 0.0}
    with Progress(console=Console(file=out, force_terminal=False, width=40), disable=True) as bar:
        progress = live_progress(bar, every_s=1.0, clock=lambda: now["t"])
        records = [dataclasses.replace(_record(index, 30), run_id="endpoint|random|rps=10|r0") for index in range(2)]
        progress.on_point_start("endpoint|random|rps=10|r0", 2)
        for record in records:
            now["t"] += 2.0
            progress.on_record(record)
        progress.on_point_end(RunEntry.of(PointId("endpoint", "random", "rps=10", 0), records, SLO()))
    lines = out.getvalue().splitlines()
    assert lines[-1] == "endpoint|random|rps=10|r0: done, 2/2 requests, TTFT p50 30 ms, 4 s"
    assert all(line.startswith("endpoint|random|rps=10|r0: ") for line in lines)  # no wrapped tails, no bar
