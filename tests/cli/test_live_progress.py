"""Progress while a point runs: off a terminal, a plain line every N seconds with the count, running TTFT p50,
request rate and ETA (rich alone prints nothing there until the point ends)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress

from kvbench.cli.live_progress import live_progress
from kvbench.measure.records import RequestRecord

MS = 1_000_000


def _record(index, ttft_ms, error=None):
    return RequestRecord(run_id="p", request_id=f"q{index}", session_id=f"s{index}", tenant="t", turn=0, queued_ns=0,
                         sent_ns=0, first_token_ns=ttft_ms * MS, done_ns=(ttft_ms + 5) * MS, error=error)


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
