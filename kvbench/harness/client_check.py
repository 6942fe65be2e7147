"""The load generator's check of itself: was the client's own lag small enough for its TTFTs to be the server's?

Two lags are measured while a run plays: schedule lag (a request's sent time minus when it was queued) and
event-loop lag (how late a 10 ms sleep wakes up). A run whose p99 lag is past its bound is marked invalid,
because its TTFTs would include the client's own delays. The bound is relative to what is measured: the larger
of `max_lag_ms` (10 ms by default) and LAG_SHARE_OF_TTFT (5%) of the point's own TTFT p50, so a 10 ms hiccup
voids a 50 ms TTFT (20% of it) but not a 10 s one (0.1%), and a 500 ms TTFT tolerates 25 ms. Several load
workers' raw lags pool into one check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.distribution import Distribution
from kvbench.measure.schedule import MODE_CONCURRENCY

_LOOP_PROBE_S = 0.01
LAG_SHARE_OF_TTFT = 0.05  # the lag bound's share of the point's TTFT p50, where that is past max_lag_ms


@dataclass(frozen=True)
class ClientCheck:
    """The client's self-check. `valid` is False when its own lag could distort the measurements."""

    schedule_lag_ms: Distribution | None
    loop_lag_ms: Distribution | None
    max_lag_ms: float
    valid: bool
    reason: str | None
    lag_bound_ms: float | None = None  # the bound applied: lag_bound_ms(max_lag_ms, the point's TTFT p50)
    # Several load workers: each one's own check, and how far apart their starts were (wall clock, ms).
    start_offset_ms: float | None = None  # this worker's start minus the planned start epoch
    workers: tuple[ClientCheck, ...] = ()
    start_spread_ms: float | None = None

    def to_dict(self) -> dict:
        out = {
            "schedule_lag_ms": self.schedule_lag_ms.to_dict() if self.schedule_lag_ms else None,
            "loop_lag_ms": self.loop_lag_ms.to_dict() if self.loop_lag_ms else None,
            "max_lag_ms": self.max_lag_ms,
            "lag_bound_ms": self.lag_bound_ms,
            "valid": self.valid,
            "reason": self.reason,
        }
        if self.start_offset_ms is not None:
            out["start_offset_ms"] = self.start_offset_ms
        if self.workers:
            out["start_spread_ms"] = self.start_spread_ms
            out["workers"] = [worker.to_dict() for worker in self.workers]
        return out


def lag_bound_ms(max_lag_ms: float, ttft_p50_ms: float | None) -> float:
    """The lag a point may show: the larger of `max_lag_ms` and LAG_SHARE_OF_TTFT of its TTFT p50 (none: the floor)."""
    return max(max_lag_ms, LAG_SHARE_OF_TTFT * ttft_p50_ms) if ttft_p50_ms is not None else max_lag_ms


def check_lags(
    schedule_lags: Sequence[float],
    loop_lags: Sequence[float],
    max_lag_ms: float,
    mode: str,
    ttft_p50_ms: float | None = None,
) -> ClientCheck:
    """The self-check of these lags (ms) against `lag_bound_ms`, for a load point of this `mode` whose TTFT p50
    was `ttft_p50_ms`."""
    schedule = Distribution.of(list(schedule_lags))
    loop = Distribution.of(list(loop_lags))
    bound = lag_bound_ms(max_lag_ms, ttft_p50_ms)
    why = f"{bound:.3g} ms" if bound == max_lag_ms else f"{bound:.3g} ms ({100 * LAG_SHARE_OF_TTFT:g}% of TTFT p50)"
    reason = None
    # Closed loop has no schedule to keep; only the loop lag matters there.
    if schedule is not None and mode != MODE_CONCURRENCY and schedule.p99 > bound:
        reason = f"schedule lag p99 {schedule.p99:.2f} ms > {why}"
    elif loop is not None and loop.p99 > bound:
        reason = f"event-loop lag p99 {loop.p99:.2f} ms > {why}"
    return ClientCheck(schedule, loop, max_lag_ms, reason is None, reason, lag_bound_ms=bound)


async def probe_loop(lags: list[float]) -> None:
    """Event-loop lag: how late a 10 ms sleep wakes up, appended to `lags` until cancelled."""
    while True:
        before = time.perf_counter_ns()
        await asyncio.sleep(_LOOP_PROBE_S)
        lags.append(max((time.perf_counter_ns() - before) / 1e6 - _LOOP_PROBE_S * 1e3, 0.0))
