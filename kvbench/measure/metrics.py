"""Pure functions from request records to summaries: exactly the metric dictionary of DESIGN.md.

Nothing here prints, plots or touches files. Times in records are nanoseconds; summaries are in
milliseconds and seconds as their names say.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from kvbench.distribution import Distribution
from kvbench.measure.records import RequestRecord
from kvbench.settings import bounded

NS_PER_MS = 1e6
NS_PER_S = 1e9
ALL_TENANTS = "all"


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput; a limit left as None is not checked."""

    ttft_ms: float | None = bounded(None, ge=0, unit="ms", help="goodput SLO on TTFT")
    tpot_ms: float | None = bounded(None, ge=0, unit="ms", help="goodput SLO on TPOT")
    e2e_ms: float | None = bounded(None, ge=0, unit="ms", help="goodput SLO on end-to-end latency")

    def met_by(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        checks = ((self.ttft_ms, ttft_ms(record)), (self.tpot_ms, tpot_ms(record)), (self.e2e_ms, e2e_ms(record)))
        for limit, value in checks:
            if limit is not None and (value is None or value > limit):
                return False
        return True


@dataclass(frozen=True)
class CacheAccounting:
    """Prompt-token sums and the rates derived from them. A rate is None when its inputs are missing."""

    prompt_tokens: int
    cached_tokens: int | None
    reusable_tokens: int
    recomputed_reusable_tokens: int | None
    requests_reporting_cached: int
    cache_hit_rate: float | None
    oracle_hit_rate: float | None
    prefill_recompute_rate: float | None


@dataclass(frozen=True)
class Summary:
    """Metrics of one group of requests (one tenant, or all of them)."""

    tenant: str
    requests: int
    completed: int
    errors: int
    duration_s: float | None
    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    tpot_ms: Distribution | None
    e2e_ms: Distribution | None
    ttft_from_schedule_ms: Distribution | None
    e2e_from_schedule_ms: Distribution | None
    queue_wait_ms: Distribution | None
    output_tokens: int
    output_tok_s: float | None
    total_tok_s: float | None
    req_s: float | None
    goodput_req_s: float | None
    slo_attainment: float | None
    cache: CacheAccounting
    error_kinds: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunSummary:
    """A run's overall summary, one per tenant, and Jain's fairness index over tenants' mean TTFT."""

    overall: Summary
    per_tenant: tuple[Summary, ...]
    ttft_fairness: float | None

    def to_dict(self) -> dict:
        return {
            "overall": self.overall.to_dict(),
            "per_tenant": [summary.to_dict() for summary in self.per_tenant],
            "ttft_fairness_jain": self.ttft_fairness,
        }


# --- per-request quantities ------------------------------------------------------------------------------


def ttft_ms(record: RequestRecord) -> float | None:
    """First non-empty token minus sent."""
    if record.first_token_ns is None or record.sent_ns is None:
        return None
    return (record.first_token_ns - record.sent_ns) / NS_PER_MS


def e2e_ms(record: RequestRecord) -> float | None:
    if record.done_ns is None or record.sent_ns is None:
        return None
    return (record.done_ns - record.sent_ns) / NS_PER_MS


def ttft_from_schedule_ms(record: RequestRecord) -> float | None:
    """First token minus the planned send time: TTFT with the client's and a closed loop's waits counted
    (coordinated-omission aware); equal to `ttft_ms` when every request went when planned."""
    if record.first_token_ns is None or record.planned_ns is None:
        return None
    return (record.first_token_ns - record.planned_ns) / NS_PER_MS


def e2e_from_schedule_ms(record: RequestRecord) -> float | None:
    """Done minus the planned send time (see `ttft_from_schedule_ms`)."""
    if record.done_ns is None or record.planned_ns is None:
        return None
    return (record.done_ns - record.planned_ns) / NS_PER_MS


def tpot_ms(record: RequestRecord) -> float | None:
    """(done - first token) / (output tokens - 1); undefined for outputs of fewer than two tokens."""
    tokens = output_token_count(record)
    if record.done_ns is None or record.first_token_ns is None or tokens is None or tokens < 2:
        return None
    return (record.done_ns - record.first_token_ns) / (tokens - 1) / NS_PER_MS


def queue_wait_ms(record: RequestRecord) -> float | None:
    if record.sent_ns is None:
        return None
    return (record.sent_ns - record.queued_ns) / NS_PER_MS


def itl_ms(record: RequestRecord) -> list[float]:
    """Inter-token gaps: a chunk carrying k tokens after a gap g contributes k gaps of g/k."""
    gaps: list[float] = []
    for (previous_ns, _), (arrival_ns, tokens) in zip(record.chunks, record.chunks[1:]):
        if tokens <= 0:
            continue
        gap = (arrival_ns - previous_ns) / NS_PER_MS / tokens
        gaps.extend([gap] * tokens)
    return gaps


def output_token_count(record: RequestRecord) -> int | None:
    """Server usage when reported, else the tokens counted in the stream."""
    if record.output_tokens is not None:
        return record.output_tokens
    if record.chunks:
        return sum(tokens for _, tokens in record.chunks)
    return None


def total_token_count(record: RequestRecord) -> int:
    """Output plus prompt tokens, as throughput counts them (an unreported count adds nothing)."""
    return (output_token_count(record) or 0) + (record.prompt_tokens or 0)


def counts_for_cache(record: RequestRecord) -> bool:
    """Whether a request enters the cache rates: it succeeded and its prompt size is known."""
    return record.ok and record.prompt_tokens is not None


def recomputed_tokens(record: RequestRecord) -> int | None:
    """Reusable prompt tokens the engine computed again, max(reusable - cached, 0); None without cached_tokens."""
    if record.cached_tokens is None:
        return None
    return max(record.reusable_tokens - record.cached_tokens, 0)


def completed(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The measured (non-warm-up) requests that succeeded: the ones latency and throughput count."""
    return [record for record in records if not record.warmup and record.ok]


def completion_spans_s(records: Sequence[RequestRecord]) -> list[float]:
    """Per request, the seconds of the run attributed to it: from the previous completion (the first send for
    the first) to its own; 0 when it has no completion time. They sum to `Summary.duration_s` over the
    `completed` requests, so a throughput is a ratio of sums over requests."""
    spans = [0.0] * len(records)
    sent = [record.sent_ns for record in records if record.sent_ns is not None]
    finished = sorted((record.done_ns, index) for index, record in enumerate(records) if record.done_ns is not None)
    if sent and finished:
        previous = min(sent)
        for done_ns, index in finished:
            spans[index] = (done_ns - previous) / NS_PER_S
            previous = done_ns
    return spans


def peak_in_flight(records: Iterable[RequestRecord]) -> int:
    """The most requests in flight at once (sent, not yet done; one without a done time counts to its end)."""
    events = sorted(
        event
        for record in records
        if record.sent_ns is not None
        for event in ((record.sent_ns, 1), (record.done_ns if record.done_ns is not None else 1 << 62, -1))
    )
    peak = level = 0
    for _, step in sorted(events, key=lambda event: (event[0], event[1])):  # an end before a start at one instant
        level += step
        peak = max(peak, level)
    return peak


def ttft_values(records: Iterable[RequestRecord]) -> list[float]:
    """The TTFTs of the measured requests that got a first token (the TTFT CDF plot's sample)."""
    return [value for record in records if not record.warmup and (value := ttft_ms(record)) is not None]


# --- aggregation -------------------------------------------------------------------------------------------


def cache_accounting(records: Sequence[RequestRecord]) -> CacheAccounting:
    """prefill_recompute_rate = sum(max(reusable - cached, 0)) / sum(reusable); hit rates over prompt tokens.

    Only successful requests count. `cached_tokens` missing on any request makes the engine-side rates
    missing rather than silently partial.
    """
    done = [record for record in records if counts_for_cache(record)]
    prompt = sum(record.prompt_tokens for record in done)
    reusable = sum(record.reusable_tokens for record in done)
    reporting = [record for record in done if record.cached_tokens is not None]
    all_report = bool(done) and len(reporting) == len(done)
    cached = sum(record.cached_tokens for record in reporting) if all_report else None
    recomputed = sum(recomputed_tokens(record) for record in reporting) if all_report else None
    return CacheAccounting(
        prompt_tokens=prompt,
        cached_tokens=cached,
        reusable_tokens=reusable,
        recomputed_reusable_tokens=recomputed,
        requests_reporting_cached=len(reporting),
        cache_hit_rate=(cached / prompt) if cached is not None and prompt else None,
        oracle_hit_rate=(reusable / prompt) if prompt else None,
        prefill_recompute_rate=(recomputed / reusable) if recomputed is not None and reusable else None,
    )


def played_duration_s(records: Sequence[RequestRecord], resumed_at_ns: Sequence[int] = ()) -> float | None:
    """The seconds the run played these records: first send to last completion of each sitting, summed. A resumed
    point played in several sittings (`resumed_at_ns`: when each later one began, on the records' monotonic
    clock); the time between them, when nothing ran, is not the run's. None when no request completed."""
    bounds = sorted(resumed_at_ns)
    total = 0.0
    for low, high in zip([None, *bounds], [*bounds, None]):
        sitting = [
            record
            for record in records
            if record.sent_ns is not None
            and record.done_ns is not None
            and (low is None or record.sent_ns >= low)
            and (high is None or record.sent_ns < high)
        ]
        if sitting:
            total += max(0, max(r.done_ns for r in sitting) - min(r.sent_ns for r in sitting)) / NS_PER_S
    return total or None


def summarize(
    records: Sequence[RequestRecord], tenant: str = ALL_TENANTS, slo: SLO = SLO(), resumed_at_ns: Sequence[int] = ()
) -> Summary:
    """Summary of the measured (non-warm-up) records given (`resumed_at_ns`: see `played_duration_s`)."""
    measured = [record for record in records if not record.warmup]
    ok = completed(measured)
    errors: dict[str, int] = {}
    for record in measured:
        if not record.ok:
            errors[record.error_kind] = errors.get(record.error_kind, 0) + 1

    duration_s = played_duration_s(ok, resumed_at_ns)

    output_tokens = sum(output_token_count(record) or 0 for record in ok)

    def per_second(amount: float) -> float | None:
        return amount / duration_s if duration_s else None

    meeting = [record for record in ok if slo.met_by(record)]
    slo_given = any(limit is not None for limit in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))

    return Summary(
        tenant=tenant,
        requests=len(measured),
        completed=len(ok),
        errors=len(measured) - len(ok),
        duration_s=duration_s,
        ttft_ms=Distribution.of(_present(ttft_ms(record) for record in ok)),
        itl_ms=Distribution.of([gap for record in ok for gap in itl_ms(record)]),
        tpot_ms=Distribution.of(_present(tpot_ms(record) for record in ok)),
        e2e_ms=Distribution.of(_present(e2e_ms(record) for record in ok)),
        ttft_from_schedule_ms=Distribution.of(_present(ttft_from_schedule_ms(record) for record in ok)),
        e2e_from_schedule_ms=Distribution.of(_present(e2e_from_schedule_ms(record) for record in ok)),
        queue_wait_ms=Distribution.of(_present(queue_wait_ms(record) for record in measured)),
        output_tokens=output_tokens,
        output_tok_s=per_second(output_tokens),
        total_tok_s=per_second(sum(total_token_count(record) for record in ok)),
        req_s=per_second(len(ok)),
        goodput_req_s=per_second(len(meeting)) if slo_given else None,
        slo_attainment=(len(meeting) / len(measured)) if slo_given and measured else None,
        cache=cache_accounting(ok),
        error_kinds=errors,
    )


def failure_reason(records: Sequence[RequestRecord], max_error_rate: float) -> str | None:
    """Why a point's requests do not make a measurement, or None when they do.

    Counts every request sent (warm-up included: a failure is a failure). Too many failed means more than
    `max_error_rate` of them, or all of them; the reason names the count and the most frequent error, e.g.
    `42/42 requests failed (limit 10%): http: 404 model 'x' is not served`.
    """
    if not records:
        return "no request was sent"
    failed = Counter(record.error for record in records if not record.ok)
    count = sum(failed.values())
    if count <= max_error_rate * len(records) and count < len(records):
        return None
    error, times = failed.most_common(1)[0]
    example = error if times == count else f"most often ({times}x): {error}"
    return f"{count}/{len(records)} requests failed (limit {max_error_rate * 100:g}%): {example}"


def answer_sources(records: Iterable[RequestRecord]) -> dict[str, int]:
    """How the next turn's copy of each successful answer was obtained: source -> requests."""
    return dict(Counter(record.answer_source for record in records if record.ok and record.answer_source))


def jain_fairness(values: Iterable[float]) -> float | None:
    """Jain's index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one takes everything."""
    array = np.asarray(list(values), dtype=np.float64)
    if array.size == 0 or not np.any(array):
        return None
    return float(array.sum() ** 2 / (array.size * np.square(array).sum()))


def summarize_run(records: Sequence[RequestRecord], slo: SLO = SLO(), resumed_at_ns: Sequence[int] = ()) -> RunSummary:
    """Overall and per-tenant summaries, plus fairness of tenants' mean TTFT (`resumed_at_ns`: see
    `played_duration_s`)."""
    tenants = sorted({record.tenant for record in records})
    per_tenant = tuple(
        summarize([record for record in records if record.tenant == tenant], tenant, slo, resumed_at_ns)
        for tenant in tenants
    )
    means = [summary.ttft_ms.mean for summary in per_tenant if summary.ttft_ms is not None]
    return RunSummary(
        overall=summarize(records, ALL_TENANTS, slo, resumed_at_ns),
        per_tenant=per_tenant,
        ttft_fairness=jain_fairness(means) if len(means) > 1 else None,
    )


def _present(values: Iterable[float | None]) -> list[float]:
    return [value for value in values if value is not None]
