"""Precise async sleeping on the perf_counter_ns clock every kvbench timestamp uses.

asyncio's timers are millisecond-granular and wake late by up to a millisecond. Keeping a schedule to well
under that needs a short busy wait before each deadline; `PreciseTimer` does that wait in ONE task for all
sleepers (a heap of deadlines), so a thousand concurrent sleepers cost one spinner, not a thousand.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time

# Sleep on the loop's timer until this close to the next deadline, then busy-wait (yielding) to it.
SPIN_WINDOW_NS = 2_000_000


class PreciseTimer:
    """Wakes each `sleep_until(t)` caller as soon as possible after `t` (a `time.perf_counter_ns()` value).

    Bound to the running loop on first use; one per loop (each load-generator run or server makes its own).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()
        self._ticker: asyncio.Task | None = None
        self._changed: asyncio.Event | None = None

    async def sleep_until(self, target_ns: int) -> None:
        """Until `target_ns`; a target already past still yields to the loop once, so that a loop of sleeps
        whose targets fall behind (arrivals faster than they can be sent) never holds the event loop."""
        if target_ns <= time.perf_counter_ns():
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        if self._changed is None:
            self._changed = asyncio.Event()
        future = loop.create_future()
        earliest = not self._heap or target_ns < self._heap[0][0]
        heapq.heappush(self._heap, (target_ns, next(self._order), future))
        if self._ticker is None or self._ticker.done():
            self._ticker = loop.create_task(self._tick())
        elif earliest:
            self._changed.set()
        await future

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()

    async def _tick(self) -> None:
        assert self._changed is not None
        while self._heap:
            now = time.perf_counter_ns()
            while self._heap and self._heap[0][0] <= now:
                _, _, future = heapq.heappop(self._heap)
                if not future.done():
                    future.set_result(None)
            if not self._heap:
                return
            remaining = self._heap[0][0] - now
            if remaining > SPIN_WINDOW_NS:
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), (remaining - SPIN_WINDOW_NS) / 1e9)
                except asyncio.TimeoutError:
                    pass
            else:
                await asyncio.sleep(0)
