"""What the scheduler takes and returns: a Request (with the SchedulerConfig it runs under) in; a StepPlan
of ScheduledSeqs and swaps per step, or the simulator's CompactPlan and DecodeRun (`compact_steps`); a
FinishedRequest at the end. Frozen values: nothing here changes state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NewType

import numpy as np

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.pages import PageId

RequestId = NewType("RequestId", str)
DEFAULT_TENANT = TenantId("default")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_step_tokens: int = 2048  # prefill chunk tokens + decode tokens per step
    # Prefill tokens a step may compute beside running decodes (None: up to max_step_tokens). Decodes are
    # scheduled first; a step without decodes prefills up to max_step_tokens. See Scheduler._schedule.
    max_prefill_beside_decodes: int | None = None
    allow_swap: bool = False  # preempt by swapping to host instead of recomputing
    strict_isolation: bool = True  # False: a request's declared-shareable prefix is cached in the shared namespace
    prefix_caching: bool = True  # False: never look up or insert cached pages (every prompt recomputed)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_step_tokens < 1:
            raise ValueError("SchedulerConfig: max_num_seqs and max_step_tokens must be >= 1")
        if self.max_prefill_beside_decodes is not None and self.max_prefill_beside_decodes < 1:
            raise ValueError("SchedulerConfig: max_prefill_beside_decodes must be >= 1 (or None: no own limit)")


# The probe that `auto` times (runtime/prefill_budget.py on our engine, sim/engine.py on the cost model): one
# sequence decoding after a PROBE_DECODE_CONTEXT-token prompt, alone and with a chunk of another prompt
# prefilled beside it, first PROBE_PREFILL_TOKENS, then twice as many while the step stays within the factor.
PROBE_DECODE_CONTEXT = 64
PROBE_PREFILL_TOKENS = 64
PROBE_CHUNKS = 3  # chunks the engine times per size: the probe's KV is the decode and these chunks
PROBE_REFINEMENTS = 2  # sizes timed inside the bracketing pair, each where the line through the pair crosses


@dataclass(frozen=True, slots=True)
class ProbeShape:
    context: int  # the decoding sequence's prompt
    first: int  # the first chunk size timed
    ceiling: int  # the largest chunk the probe may time: the step budget, and what the device KV holds


def probe_shape(max_step_tokens: int, capacity_tokens: int) -> ProbeShape:
    """The probe within the step budget (one token of it is the decode) and the device KV (the decode and
    PROBE_CHUNKS chunks resident)."""
    ceiling = max(1, min(max_step_tokens - 1, capacity_tokens // (2 * PROBE_CHUNKS)))
    first = min(PROBE_PREFILL_TOKENS, ceiling)
    return ProbeShape(min(PROBE_DECODE_CONTEXT, first), first, ceiling)


def stall_bounded_prefill(step_s: Callable[[int], float], shape: ProbeShape, factor: float) -> int:
    """max_prefill_beside_decodes chosen so that a step with running decodes takes at most `factor` times a pure
    decode step. `step_s(n)`: the seconds of a decode step with an n-token prefill chunk beside it (0: none),
    timed by our engine or costed by the simulator: one rule for both. Chunks of shape.first, then doubling up
    to shape.ceiling, are tried until one exceeds the factor (a roofline's flat part is walked, not
    extrapolated); inside that pair, PROBE_REFINEMENTS sizes where the line through the pair crosses the factor
    (regula falsi); the budget is the last crossing, at most the largest size within and at least 1."""
    if factor <= 1:
        raise ValueError(f"stall_bounded_prefill: factor {factor:g} must be > 1")
    allowed = factor * step_s(0)
    low, low_s, n = 0, step_s(0), shape.first
    while (seconds := step_s(n)) <= allowed:
        if n >= shape.ceiling:
            return shape.ceiling
        low, low_s, n = n, seconds, min(2 * n, shape.ceiling)
    high, high_s = n, seconds  # low_s <= allowed < high_s
    for refined in range(PROBE_REFINEMENTS + 1):
        cross = low + int((allowed - low_s) * (high - low) / (high_s - low_s))
        if cross <= low or cross >= high or refined == PROBE_REFINEMENTS:
            break
        if (seconds := step_s(cross)) <= allowed:
            low, low_s = cross, seconds
        else:
            high, high_s = cross, seconds
    return max(1, min(high - 1, max(low, cross)))


@dataclass(frozen=True, slots=True)
class Request:
    request_id: RequestId
    prompt: np.ndarray  # 1-D token ids
    max_new_tokens: int
    tenant: TenantId = DEFAULT_TENANT
    # Leading prompt tokens declared shareable across tenants (outside strict isolation; see placement_for)
    shared_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    # False: compute the whole prompt even if it is cached (e.g. prompt logprobs need every position's logits)
    use_cached_prefix: bool = True

    def __post_init__(self) -> None:
        if np.ndim(self.prompt) != 1 or len(self.prompt) == 0:
            raise ValueError(f"request {self.request_id}: prompt must be a non-empty 1-D array of token ids")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_new_tokens must be >= 1")

    @property
    def shareable(self) -> bool:
        """Whether the whole prompt is declared shareable, so that one namespace holds all of it (what a
        caller that looks a prompt up in one namespace, like the simulator's tiers, may rely on)."""
        return self.shared_tokens >= len(self.prompt)


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    request_id: RequestId
    page_table: tuple[PageId, ...]
    start: int  # first token position computed this step
    end: int  # one past the last
    num_cached_tokens: int  # prompt tokens found in the cache at (first) admission
    samples: bool  # the model samples one token for this sequence this step


@dataclass(frozen=True, slots=True)
class SwapOut:
    request_id: RequestId
    pages: tuple[PageId, ...]


@dataclass(frozen=True, slots=True)
class SwapIn:
    request_id: RequestId
    pages: tuple[PageId, ...]


@dataclass(frozen=True, slots=True)
class StepPlan:
    now: float
    seqs: tuple[ScheduledSeq, ...]
    preempted: tuple[RequestId, ...] = ()
    swap_out: tuple[SwapOut, ...] = ()
    swap_in: tuple[SwapIn, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(s.end - s.start for s in self.seqs)


@dataclass(frozen=True, slots=True)
class CompactPlan:
    """A StepPlan as the simulator needs it (see `schedule_compact`): the same step, in the same order, but a
    sequence that decodes (computes the one token it sampled last) is its sequence's state, not a
    ScheduledSeq; its span is [start, start + 1) with start in `decode_starts` (in entry order)."""

    now: float
    entries: tuple  # ScheduledSeq, or the _Seq of a decoding sequence
    decode_starts: tuple[int, ...]
    preempted: tuple[RequestId, ...] = ()
    swap_out: tuple[SwapOut, ...] = ()
    swap_in: tuple[SwapIn, ...] = ()
    sampled_ids: tuple[RequestId, ...] = ()  # requests that receive a token at the end of the step, in entry order

    @property
    def others(self) -> tuple[ScheduledSeq, ...]:
        """The entries that are not decodes (prefill chunks, the last of which samples)."""
        return tuple(e for e in self.entries if type(e) is ScheduledSeq)


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """The next `steps` steps are certain to be pure decodes of the running sequences `request_ids` (in running
    order), each computing the token it sampled last, with nothing admitted or preempted, and nothing finished
    before the last step (see `decode_run`). In the run's step j (from 0) sequence i computes position `starts[i] + j`, so the step's
    decode spans sum to `starts_sum + j * len(request_ids)` and the longest starts at `longest_start + j`."""

    steps: int
    request_ids: tuple[RequestId, ...]
    starts_sum: int
    longest_start: int


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    request_id: RequestId
    prompt_tokens: int
    num_cached_tokens: int
    output: tuple[int, ...]
    finish_reason: str  # "length" or "stop"
