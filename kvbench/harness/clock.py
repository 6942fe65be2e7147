"""Precise async sleeping on the perf_counter_ns clock every kvbench timestamp uses."""

from __future__ import annotations

import asyncio
import time

# Sleep until this close to a deadline, then yield to the loop until it passes: asyncio timers are
# millisecond-granular, and schedules must be kept to well under a millisecond.
SPIN_WINDOW_NS = 2_000_000


async def sleep_until(target_ns: int) -> None:
    """Return as soon as possible after `target_ns` (a `time.perf_counter_ns()` value), letting others run."""
    remaining = target_ns - time.perf_counter_ns()
    if remaining > SPIN_WINDOW_NS:
        await asyncio.sleep((remaining - SPIN_WINDOW_NS) / 1e9)
    while time.perf_counter_ns() < target_ns:
        await asyncio.sleep(0)
