"""The gate every request of a load point passes before it is sent: when it may go, and when it was meant to.

Which gate a load point gets (`gate_for`):

- `OpenGate` (no gate): a session-rate or trace schedule without a cap; the sessions' own schedule decides.
- `SlotGate`: at most N requests in flight: a closed loop's concurrency, or an open loop's max_concurrency
  (vLLM's `--max-concurrency`); a request past the cap waits for one to finish.
- `ArrivalGate`: request arrivals at a rate (vLLM's `--request-rate`, Poisson or gamma), each arrival letting
  through the request that is ready, a session's next turn before a new session's first one, then the cap if
  one is set. An arrival that finds no request ready (every session busy or thinking) is missed: the point
  sent fewer requests per second than asked, and `missed` counts them.

`enter` returns an `Admission`: `planned_ns` is when the schedule meant the request to go (its arrival; what
TTFT from schedule counts from), `queued_ns` when the gate let it through (sent - queued is the client's own
lag). None means the run may send no more.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from kvbench.harness.clock import PreciseTimer
from kvbench.measure.schedule import MODE_CONCURRENCY, MODE_REQUEST_RATE, LoadSpec, request_gaps


@dataclass(frozen=True)
class Admission:
    planned_ns: int
    queued_ns: int


class Gate(Protocol):
    async def enter(self, ready_ns: int, first_turn: bool) -> Admission | None:
        """Wait until the request that became ready at `ready_ns` may go."""

    def leave(self) -> None:
        """The request let through by `enter` is over (answered or failed)."""

    def close(self) -> None:
        """The point is over: stop pacing and let every waiter through with None."""


class OpenGate:
    """No gate: every request goes when it is ready."""

    missed = 0

    async def enter(self, ready_ns: int, first_turn: bool) -> Admission | None:
        return Admission(ready_ns, ready_ns)

    def leave(self) -> None:
        pass

    def close(self) -> None:
        pass


class SlotGate:
    """At most `slots` requests in flight; one queued behind the cap is queued again when a slot frees up."""

    missed = 0

    def __init__(self, slots: int) -> None:
        self._slots = asyncio.Semaphore(slots)

    async def enter(self, ready_ns: int, first_turn: bool) -> Admission | None:
        await self._slots.acquire()
        return Admission(ready_ns, time.perf_counter_ns())

    def leave(self) -> None:
        self._slots.release()

    def close(self) -> None:
        pass


class ArrivalGate:
    """Request arrivals at `t0_ns` + cumulative `gaps` (seconds); each lets the first ready request through.

    Ready requests wait in a heap ordered (first turn?, arrival at the gate): a session's next turn goes before
    a new session starts, so sessions open only as fast as the rate needs them. `may_send` is asked at each
    arrival; once it says no, every waiter is let through with None (they then see the run is over) instead
    of each waiting for an arrival of its own."""

    def __init__(
        self,
        gaps: Iterator[float],
        t0_ns: int,
        timer: PreciseTimer,
        may_send: Callable[[], bool],
        cap: int | None = None,
    ) -> None:
        self._gaps = gaps
        self._t0_ns = t0_ns
        self._timer = timer
        self._may_send = may_send
        self._cap = SlotGate(cap) if cap is not None else OpenGate()
        self._waiting: list[tuple[bool, int, asyncio.Future]] = []
        self._order = itertools.count()
        self._ticker: asyncio.Task | None = None
        self._closed = False
        self.missed = 0  # arrivals that found no request ready

    async def enter(self, ready_ns: int, first_turn: bool) -> Admission | None:
        if self._closed:
            return None
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._arrivals())
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (first_turn, next(self._order), future))
        arrival_ns = await future
        if arrival_ns is None:
            return None
        admitted = await self._cap.enter(arrival_ns, first_turn)
        return Admission(arrival_ns, max(admitted.queued_ns, arrival_ns)) if admitted else None

    def leave(self) -> None:
        self._cap.leave()

    def close(self) -> None:
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)

    async def _arrivals(self) -> None:
        arrival_ns = self._t0_ns
        for gap in self._gaps:
            arrival_ns += int(gap * 1e9)
            await self._timer.sleep_until(arrival_ns)
            if not self._may_send():
                break
            while self._waiting and self._waiting[0][2].done():  # cancelled waiters
                heapq.heappop(self._waiting)
            if self._waiting:
                heapq.heappop(self._waiting)[2].set_result(arrival_ns)
            else:
                self.missed += 1
        self._ticker = None
        self.close()


def gate_for(load: LoadSpec, seed: int, t0_ns: int, timer: PreciseTimer, may_send: Callable[[], bool]) -> Gate:
    """The gate of `load`'s mode (see the module's docstring); an infinite request rate is no pacing at all."""
    if load.mode == MODE_REQUEST_RATE and not math.isinf(load.request_rate):
        return ArrivalGate(
            request_gaps(load.request_rate, load.burstiness, seed), t0_ns, timer, may_send, cap=load.max_concurrency
        )
    if load.mode == MODE_CONCURRENCY or load.cap is not None:
        return SlotGate(load.cap)
    return OpenGate()
