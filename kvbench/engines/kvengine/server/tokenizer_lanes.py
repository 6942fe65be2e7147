"""Tokenising and chat templating off the event loop, in two lanes, each one thread with a bounded queue.

A request's cost is the characters it asks to tokenise (`admission`: its text, or its chat's templated
length bound); its lane is chosen by the tokens those characters make, estimated with the tokenizer's own
characters per token (`chars_per_token`, measured at start). Up to `LaneLimits.small_tokens` it goes to the
small lane, else to the large one, so a normal request never waits behind a long one: before the lanes, five
100,000-message chats held a token-id request for 15.3 s on the server's single tokenizer thread; with a bound
of 32,768 characters, forty 30,000-character prompts shared the small lane with "hello world" (its p50 821 ms).
Token-id prompts cost nothing and take no lane.

Each lane admits a request while it holds fewer than `max_requests` and (for the large lane) its queued
characters stay within `max_chars`; a lane that is empty always admits one. Otherwise `LaneFull` (the server
answers 429 with Retry-After, counted in `kvbench:tokenize_rejected_total{lane}`). `saturated()` names the lanes
that would refuse a request of their largest size (`/ready` answers 503 while any would).

The large lane's thread runs at a lower CPU priority (nice 10): tokenising half a million characters is CPU
work that would otherwise take a core from the engine's steps. Both lanes call the same tokenizer: a fast
(Rust) tokenizer encodes from several threads at once as long as no call changes its truncation or padding,
and none of ours does (and it releases the GIL while it encodes). Depths are touched on the event loop only.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from kvbench.engines.kvengine.server.server_metrics import ServerMetrics

T = TypeVar("T")
RETRY_AFTER_S = 1
LARGE_LANE_NICENESS = 10  # the large lane's thread yields the CPU to the engine, the loop and the small lane


SAMPLE = (
    "The quick brown fox jumps over the lazy dog while the cache keeps every page it can, and the server "
    "answers each request in turn. "
) * 4


def chars_per_token(tokenizer) -> float:
    """Characters per token of `tokenizer` on English prose (at least 1): what a prompt's length says of its
    tokens. Text of rarer characters makes more tokens per character; the large lane's bounds hold either way."""
    try:
        tokens = len(tokenizer(SAMPLE)["input_ids"])
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode prose: count characters as tokens
        return 1.0
    return max(len(SAMPLE) / max(tokens, 1), 1.0)


@dataclass(frozen=True)
class LaneLimits:
    small_tokens: int = 1024  # a request estimated at up to this many tokens is small
    small_requests: int = 256  # queued or running in the small lane
    large_requests: int = 16
    large_chars: int | None = None  # queued characters in the large lane; None: twice the largest request


class LaneFull(Exception):
    """The request's lane cannot take it now; retry after `retry_after_s`."""

    def __init__(self, lane: str, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(
            f"the server is busy tokenising other long requests ({lane} lane full); retry after {retry_after_s} s"
        )
        self.lane = lane
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Lane:
    name: str
    max_requests: int
    max_chars: int | None  # None: bounded by count only
    largest: int  # the largest request this lane takes (for `saturated`)
    executor: ThreadPoolExecutor
    depth: int = 0
    chars: int = 0

    def admits(self, cost: int) -> bool:
        if self.depth == 0:
            return True
        if self.depth >= self.max_requests:
            return False
        return self.max_chars is None or self.chars + cost <= self.max_chars

    @property
    def saturated(self) -> bool:
        return not self.admits(self.largest)


@dataclass
class TokenizerLanes:
    """The server's two tokenizer lanes. `max_request_chars`: the most characters any request may tokenise;
    `chars_per_token`: the tokenizer's (`chars_per_token`)."""

    max_request_chars: int
    metrics: ServerMetrics
    limits: LaneLimits = LaneLimits()
    chars_per_token: float = 1.0
    lanes: dict[str, Lane] = field(init=False)

    def __post_init__(self) -> None:
        limits, largest = self.limits, self.max_request_chars
        self.lanes = {
            "small": Lane(
                "small", limits.small_requests, None, self.small_chars, ThreadPoolExecutor(1, "kvengine-tokenize-small")
            ),
            "large": Lane(
                "large",
                limits.large_requests,
                limits.large_chars or 2 * largest,
                largest,
                ThreadPoolExecutor(1, "kvengine-tokenize-large", initializer=_lower_priority),
            ),
        }
        for name in self.lanes:
            self.metrics.lane_depth(name, 0)

    @property
    def small_chars(self) -> int:
        """The most characters a small request has: `small_tokens` at the tokenizer's characters per token."""
        return int(self.limits.small_tokens * self.chars_per_token)

    def lane_for(self, cost: int) -> Lane:
        return self.lanes["small" if cost <= self.small_chars else "large"]

    async def run(self, cost: int, fn: Callable[..., T], *args) -> T:
        """`fn(*args)` on the lane for `cost` characters (inline for 0), or LaneFull at once."""
        if cost == 0:
            return fn(*args)
        lane = self.lane_for(cost)
        if not lane.admits(cost):
            self.metrics.lane_rejected(lane.name)
            raise LaneFull(lane.name)
        lane.depth, lane.chars = lane.depth + 1, lane.chars + cost
        self.metrics.lane_depth(lane.name, lane.depth)
        try:
            return await asyncio.get_running_loop().run_in_executor(lane.executor, fn, *args)
        finally:
            lane.depth, lane.chars = lane.depth - 1, lane.chars - cost
            self.metrics.lane_depth(lane.name, lane.depth)

    def saturated(self) -> list[str]:
        return [name for name, lane in self.lanes.items() if lane.saturated]

    def depths(self) -> dict[str, int]:
        return {name: lane.depth for name, lane in self.lanes.items()}

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.executor.shutdown(wait=False, cancel_futures=True)


def _lower_priority() -> None:
    """Raise this thread's niceness (Linux schedules threads one by one); elsewhere a no-op."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LARGE_LANE_NICENESS)
    except (AttributeError, OSError):
        pass
