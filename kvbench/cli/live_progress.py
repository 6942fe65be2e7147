"""What `kvbench run` shows while a point runs: per point, requests answered, errors, the running TTFT p50
and request rate; the bar's ETA from rich. Where the console is not a terminal (CI logs, pipes, nohup) the bar
is off (`kvbench run` disables it: rich would print it once at the end, wrapped and cut), and plain lines take its
place, never wrapped: one every `every_s` seconds while a point runs, and one when it ends."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from rich.markup import escape
from rich.progress import Progress

from kvbench.harness.runner import Progress as RunProgress
from kvbench.measure.metrics import ttft_ms
from kvbench.measure.run_folder import RunEntry

DEFAULT_EVERY_S = 10.0


@dataclass(slots=True)
class _Point:
    task: int
    total: int
    started: float
    done: int = 0
    errors: int = 0
    ttfts: list[float] = field(default_factory=list)

    def status(self, now: float) -> str:
        parts = [f"errors {self.errors}"] if self.errors else []
        if self.ttfts:
            parts.append(f"TTFT p50 {np.median(self.ttfts):.0f} ms")
        elapsed = now - self.started
        if self.done and elapsed > 0:
            parts.append(f"{self.done / elapsed:.2f} req/s")
        return ", ".join(parts)

    def line(self, run_id: str, now: float) -> str:
        elapsed = now - self.started
        eta = (self.total - self.done) * elapsed / self.done if self.done else None
        left = f", ETA {eta:.0f} s" if eta is not None and self.done < self.total else ""
        status = self.status(now)
        return f"{run_id}: {self.done}/{self.total} requests{', ' + status if status else ''}, {elapsed:.0f} s{left}"


def live_progress(bar: Progress, every_s: float = DEFAULT_EVERY_S, clock=time.monotonic) -> RunProgress:
    """The run's progress callbacks drawing `bar` (and plain lines off a terminal, every `every_s` s)."""
    points: dict[str, _Point] = {}
    last_line = {"at": clock()}
    plain = not bar.console.is_terminal

    def start(run_id: str, total: int) -> None:
        points[run_id] = _Point(bar.add_task(escape(run_id), total=total, status=""), total, clock())

    def record(rec) -> None:
        point = points.get(rec.run_id)
        if point is None:
            return
        now = clock()
        point.done += 1
        if rec.error:
            point.errors += 1
        elif (value := ttft_ms(rec)) is not None and not rec.warmup:
            point.ttfts.append(value)
        bar.update(point.task, advance=1, status=point.status(now))
        if plain and now - last_line["at"] >= every_s:
            last_line["at"] = now
            _plain_line(bar, point.line(rec.run_id, now))

    def end(entry: RunEntry) -> None:
        ttft = entry.summary["overall"]["ttft_ms"]
        point = points.get(entry.run_id)
        if point is None:
            return
        status = f"TTFT p50 {ttft['p50']:.0f} ms" if ttft else "no successful request"
        bar.update(point.task, status=status)
        if plain:
            _plain_line(
                bar,
                f"{entry.run_id}: done, {point.done}/{point.total} requests, {status}, {clock() - point.started:.0f} s",
            )

    return RunProgress(
        on_point_start=start, on_record=record, on_point_end=end, on_message=lambda text: _plain_line(bar, text)
    )


def _plain_line(bar: Progress, text: str) -> None:
    """One line as it is: no markup, no highlighting, and not wrapped at the console's width (a log's reader
    greps it whole)."""
    bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
