"""Arrival strategies and stop conditions: when each session starts, and when the run stops sending.

Open loop: session arrivals on an absolute schedule computed before the run (Poisson, or gamma with a
burstiness factor as in vLLM's benchmark: shape = burstiness, so 1.0 is Poisson and smaller is burstier).
Request rate (vLLM's `--request-rate`): *request* arrivals on such a schedule, each one taken by the next
request that is ready (a session's next turn first, else a new session's first turn).
Closed loop: a fixed number of requests in flight. Trace: the workload's own arrival times.
A `max_concurrency` cap (vLLM's `--max-concurrency`) combines with either open loop: an arrival past the cap
waits for a request to finish. Stages (`measure/stages.py`): a Poisson ladder, one point per measured stage.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvbench.measure.stages import StagedLoad

# What one load generator can schedule: past these a rate's gaps are below the clock's nanosecond (no request
# was sent at --request-rate 1e12, and the arrival loop never gave the event loop back), a burstiness's gamma
# draws are 0 or 10^299 s, a count is more than any run sends. A LoadSpec beyond them is refused, naming it.
MAX_RATE = 1e5  # requests (or sessions) per second
BURSTINESS_RANGE = (1e-3, 1e3)
MAX_COUNT = 10**8  # requests, sessions, warm-up requests
MAX_CONCURRENCY = 10**5  # requests in flight (each one a connection)
MAX_DURATION_S = 30 * 86400.0

MODE_RATE = "rate"
MODE_CONCURRENCY = "concurrency"
MODE_TRACE = "trace"
MODE_REQUEST_RATE = "request-rate"


@dataclass(frozen=True)
class LoadSpec:
    """One load point.

    - `rate`: new sessions per second, open loop (for single-turn workloads, requests per second).
    - `request_rate`: requests per second, open loop, as vLLM's `--request-rate`; `inf` sends every request
      as soon as it is ready (vLLM's default).
    - `concurrency`: at most this many requests in flight, closed loop; all sessions are ready at once.
    - none of these: replay the workload's own arrival times (scaled by the workload's time scale).
    - `max_concurrency`: a cap on requests in flight under `rate`, `request_rate` or a trace (vLLM's
      `--max-concurrency`); an arrival past it waits, and its TTFT from schedule counts the wait.
    - `stage`: one measured stage of a ladder (with `rate` its Poisson rate): the stage's own sessions at the
      plan's arrivals (`StagedLoad.parts`); the stop conditions below do not apply, the stage is the load.
    Stop conditions: at most `num_requests` requests sent, and none sent after `duration_s`; whichever comes
    first. The first `warmup_requests` requests are sent and recorded but excluded from metrics.
    """

    rate: float | None = None
    concurrency: int | None = None
    burstiness: float = 1.0
    num_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    request_rate: float | None = None
    max_concurrency: int | None = None
    stage: StagedLoad | None = None

    def __post_init__(self) -> None:
        if self.stage is not None and (
            self.rate != self.stage.stage.rate or self.cap is not None or self.request_rate is not None
        ):
            raise ValueError("load: a stage is Poisson at its own rate: give rate=stage.rate, nothing else")
        given = [name for name in ("rate", "request_rate", "concurrency") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(
                f"load: give one of rate (sessions/s), request_rate (requests/s) or concurrency, not "
                f"{' and '.join(given)}"
            )
        _check_range("load.rate", self.rate, 0, MAX_RATE, "sessions/s")
        if self.request_rate is not None and not math.isinf(self.request_rate):
            _check_range("load.request_rate", self.request_rate, 0, MAX_RATE, "requests/s (or inf)")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"load.request_rate must be > 0 requests/s (or inf), got {self.request_rate}")
        if self.max_concurrency is not None and self.concurrency is not None:
            raise ValueError(
                "load: max_concurrency caps an open loop (rate or request_rate); concurrency is "
                "already a closed loop's cap: give one of them"
            )
        _check_range("load.max_concurrency", self.max_concurrency, 1, MAX_CONCURRENCY, "requests", inclusive=True)
        _check_range("load.concurrency", self.concurrency, 1, MAX_CONCURRENCY, "requests", inclusive=True)
        _check_range("load.burstiness", self.burstiness, *BURSTINESS_RANGE, "(1.0 = Poisson)", inclusive=True)
        _check_range("num_requests", self.num_requests, 1, MAX_COUNT, "requests", inclusive=True)
        _check_range("duration", self.duration_s, 0, MAX_DURATION_S, "s")
        _check_range("warmup_requests", self.warmup_requests, 0, MAX_COUNT, "requests", inclusive=True)

    @property
    def mode(self) -> str:
        if self.rate is not None:
            return MODE_RATE
        if self.request_rate is not None:
            return MODE_REQUEST_RATE
        if self.concurrency is not None:
            return MODE_CONCURRENCY
        return MODE_TRACE

    @property
    def label(self) -> str:
        """A short name for tables: `rate=2`, `rps=4`, `conc=8` or `trace`, a cap as `,max=4`; a stage's own
        (`10/s x 20 s`)."""
        if self.stage is not None:
            return self.stage.stage.label
        cap = f",max={self.max_concurrency}" if self.max_concurrency is not None else ""
        if self.rate is not None:
            return f"rate={self.rate:g}{cap}"
        if self.request_rate is not None:
            return f"rps={self.request_rate:g}{cap}"
        if self.concurrency is not None:
            return f"conc={self.concurrency}"
        return f"trace{cap}"

    @property
    def cap(self) -> int | None:
        """The most requests in flight: the closed loop's concurrency or the open loop's max_concurrency."""
        return self.concurrency if self.concurrency is not None else self.max_concurrency


def is_closed_loop(label: str) -> bool:
    """Whether a load's `LoadSpec.label` names a closed loop (a concurrency), as run folders store it."""
    return label.startswith("conc=")


def _check_range(name: str, value: float | None, low: float, high: float, unit: str, inclusive: bool = False) -> None:
    """ValueError naming `name` unless `value` (None: not given) lies in (low, high] ([low, high] inclusive)."""
    if value is None:
        return
    if not (low <= value <= high if inclusive else low < value <= high):  # NaN fails both
        opening = "[" if inclusive else "("
        raise ValueError(f"{name} must be in {opening}{low:g}, {high:g}] {unit}, got {value:g}")


def session_offsets(load: LoadSpec, workload_arrivals: list[float], seed: int) -> list[float]:
    """Start offsets in seconds for each session, in the workload's order.

    Rate mode draws inter-arrival gaps from a gamma distribution with mean 1/rate and shape = burstiness
    (exponential when burstiness is 1). Closed loop starts everything at 0; trace mode keeps the workload's.
    """
    count = len(workload_arrivals)
    if load.mode == MODE_RATE:
        rng = np.random.default_rng(seed)
        shape = load.burstiness
        gaps = rng.gamma(shape, 1.0 / (load.rate * shape), size=count)
        offsets = np.cumsum(gaps) - gaps[0] if count else gaps  # the first session starts at once
        return [float(offset) for offset in offsets]
    if load.mode in (MODE_CONCURRENCY, MODE_REQUEST_RATE):
        return [0.0] * count  # request rate: every session is ready, the request arrivals pace them
    start = min(workload_arrivals, default=0.0)
    return [arrival - start for arrival in workload_arrivals]


def request_gaps(request_rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Gaps in seconds between request arrivals, endless: gamma with mean 1/request_rate and shape burstiness
    (exponential, a Poisson process, when burstiness is 1), as vLLM's `get_request` draws them; the first
    request arrives at once (gap 0). An infinite rate has every gap 0. vLLM also rescales its finite list of
    arrivals so that the last lands at N/rate; an endless stream has no last arrival, so this one does not."""
    yield 0.0
    if math.isinf(request_rate):
        while True:
            yield 0.0
    rng = np.random.default_rng(seed)
    scale = 1.0 / (request_rate * burstiness)
    while True:
        yield from (float(gap) for gap in rng.gamma(burstiness, scale, size=256))


def split_exactly(total: int, weights: list[int]) -> list[int]:
    """`total` split into parts proportional to `weights` that sum to exactly `total` (largest remainders);
    equal weights give parts that differ by at most one, the larger ones first."""
    weight_sum = sum(weights)
    if weight_sum <= 0:
        return [0] * len(weights)
    exact = [total * weight / weight_sum for weight in weights]
    parts = [int(value) for value in exact]
    by_remainder = sorted(range(len(weights)), key=lambda index: (parts[index] - exact[index], index))
    for index in by_remainder[: total - sum(parts)]:
        parts[index] += 1
    return parts


@dataclass(frozen=True)
class WorkerShare:
    """What one load worker plays of a point: whole sessions (indices into the workload, in schedule order),
    their start offsets from the common start, and its share of the load (the closed loop's concurrency, the
    request budget and the warm-up, split exactly across workers)."""

    worker: int
    sessions: tuple[int, ...]
    offsets: tuple[float, ...]
    load: LoadSpec


def split_schedule(load: LoadSpec, offsets: list[float], turns: list[int], workers: int) -> list[WorkerShare]:
    """One schedule for `workers` load workers: every session's start offset is fixed here, once, and each
    session is played whole by one worker (dealt round-robin in start order, so every worker's arrivals span
    the run). A closed loop's concurrency is split exactly (`concurrency` workers at most); the request budget
    and warm-up are split in proportion to the turns each worker holds. Workers left without a session or a
    slot are not planned."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    count = min(workers, len(offsets), load.cap or workers)
    order = sorted(range(len(offsets)), key=lambda index: (offsets[index], index))
    dealt = [order[worker::count] for worker in range(count)]
    held = [sum(turns[index] for index in indices) for indices in dealt]
    concurrency = split_exactly(load.concurrency, [1] * count) if load.concurrency else [None] * count
    cap = split_exactly(load.max_concurrency, [1] * count) if load.max_concurrency else [None] * count
    # Independent Poisson arrivals of rate R/k add up to Poisson arrivals of rate R.
    request_rate = load.request_rate / count if load.request_rate is not None else None
    budget = split_exactly(load.num_requests, held) if load.num_requests is not None else [None] * count
    warmup = split_exactly(load.warmup_requests, held)
    shares = []
    for worker, indices in enumerate(dealt):
        if budget[worker] == 0:
            continue  # a budget too small to reach this worker's sessions
        share_load = dataclasses.replace(
            load,
            concurrency=concurrency[worker],
            num_requests=budget[worker],
            warmup_requests=warmup[worker],
            max_concurrency=cap[worker],
            request_rate=request_rate,
        )
        shares.append(WorkerShare(worker, tuple(indices), tuple(offsets[index] for index in indices), share_load))
    return shares
