"""vLLM's load flags against the instrument: request arrivals at a rate (Poisson or gamma), and a concurrency cap
that combines with either open loop."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from scipy import stats

from kvbench.harness.client import EndpointConfig
from kvbench.harness.instrument import InstrumentBehaviour
from kvbench.harness.loadgen import LoadGenerator
from kvbench.harness.workers import plan_jobs
from kvbench.measure.schedule import LoadSpec, request_gaps, split_schedule

from .instrument_fixture import serving
from .test_loadgen import workload
from .timing import ONE_LATE_MS


def _gaps(rate, burstiness, seed=0, count=3000):
    gaps = list(itertools.islice(request_gaps(rate, burstiness, seed), count + 1))
    assert gaps[0] == 0.0  # the first request goes at once
    return np.asarray(gaps[1:])


def test_request_gaps_are_exponential_at_the_rate():
    gaps = _gaps(rate=8.0, burstiness=1.0)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 8.0)).pvalue > 0.01
    assert stats.kstest(gaps, "expon", args=(0, 1 / 10.0)).pvalue < 1e-6  # another rate is told apart


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_is_vllms_gamma_shape_at_the_same_mean(burstiness):
    gaps = _gaps(rate=5.0, burstiness=burstiness)
    assert stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (5.0 * burstiness))).pvalue > 0.01
    assert stats.kstest(gaps, "expon", args=(0, 1 / 5.0)).pvalue < 1e-6  # not Poisson
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.1)


def test_an_infinite_request_rate_sends_everything_at_once():
    assert list(itertools.islice(request_gaps(float("inf"), 1.0, 0), 5)) == [0.0] * 5


def _play(behaviour, wl, load, **generator):
    async def go():
        async with serving(behaviour) as (url, log):
            result = await LoadGenerator(EndpointConfig(base_url=url, model="m"), load, run_id="t", **generator).run(wl)
            return result, log
    return asyncio.run(go())


def _most_in_flight(records) -> int:
    events = sorted([(r.sent_ns, 1) for r in records] + [(r.done_ns, -1) for r in records])
    return max(itertools.accumulate(change for _, change in events))


def test_request_arrivals_are_the_drawn_poisson_schedule():
    """Single-turn sessions at 40 requests/s: each request is sent at its drawn arrival (within the client's
    bound), so the sends are Poisson at the rate; slow answers do not hold the next arrival back."""
    load = LoadSpec(request_rate=40.0, num_requests=30)
    result, _ = _play(InstrumentBehaviour(first_token_ms=200, chunk_interval_ms=5), workload(sessions=30, max_tokens=3),
                      load, seed=3, max_lag_ms=ONE_LATE_MS)
    planned = np.cumsum(list(itertools.islice(request_gaps(40.0, 1.0, 3), 30)))
    sent = np.sort([record.sent_ns for record in result.records])
    assert len(sent) == 30
    assert np.allclose((sent - sent[0]) / 1e9, planned, atol=ONE_LATE_MS / 1e3)
    assert planned[-1] > 0.3  # ~0.75 s planned: all at once, or at 10x the rate, is outside the bound
    assert result.missed_arrivals == 0 and result.client.valid


@pytest.mark.parametrize("load", [LoadSpec(request_rate=200.0, max_concurrency=3, num_requests=24),
                                  LoadSpec(rate=200.0, max_concurrency=3, num_requests=24),
                                  LoadSpec(request_rate=float("inf"), max_concurrency=3, num_requests=24)],
                         ids=["request-rate", "session-rate", "inf"])
def test_max_concurrency_caps_requests_in_flight_under_an_open_loop(load):
    """Arrivals far faster than 40 ms answers: without the cap ~8-24 would be in flight; with it never more than
    3 (and 3 is reached), and the waits behind the cap show in TTFT from schedule, not in TTFT."""
    from kvbench.measure.metrics import summarize

    result, log = _play(InstrumentBehaviour(first_token_ms=40, chunk_interval_ms=2), workload(sessions=24, max_tokens=2),
                        load)
    assert len(result.records) == 24 and all(record.ok for record in result.records)
    assert _most_in_flight(result.records) == 3
    assert len(log.arrivals_ns) == 24
    summary = summarize(result.records)
    assert summary.ttft_from_schedule_ms.p99 > 3 * summary.ttft_ms.p99


def test_a_sessions_next_turn_takes_an_arrival_before_a_new_session_starts():
    """Multi-turn sessions at a request rate slower than the answers: each arrival goes to the session whose
    next turn is ready, so sessions are played one after another rather than all opened at once (burstiness 400:
    gaps of 100 ms +- 5 ms, far above the ~3 ms answers even on a busy machine)."""
    result, _ = _play(InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1), workload(sessions=3, turns=3, max_tokens=2),
                      LoadSpec(request_rate=10.0, burstiness=400.0), seed=1)
    order = [(record.session_id, record.turn) for record in sorted(result.records, key=lambda r: r.sent_ns)]
    assert order == [(f"s{s}", t) for s in range(3) for t in range(3)]


def test_the_request_budget_ends_a_request_rate_point_with_sessions_still_waiting():
    result, _ = _play(InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1), workload(sessions=200, max_tokens=2),
                      LoadSpec(request_rate=100.0, num_requests=5))
    assert len(result.records) == 5


def test_workers_share_the_rate_and_the_cap_and_draw_their_own_arrivals():
    load = LoadSpec(request_rate=9.0, max_concurrency=5, num_requests=12)
    shares = split_schedule(load, [0.0] * 6, [2] * 6, workers=3)
    assert [share.load.request_rate for share in shares] == [3.0] * 3
    assert sorted(share.load.max_concurrency for share in shares) == [1, 2, 2]
    generator = LoadGenerator(EndpointConfig("http://x", "m"), load, run_id="t", seed=7)
    jobs = plan_jobs(generator, workload(sessions=6, turns=2), workers=3)
    assert len({job.generator.seed for job in jobs}) == 3


def test_load_spec_refuses_mixed_modes_by_name():
    with pytest.raises(ValueError, match="rate .* and request_rate"):
        LoadSpec(rate=1.0, request_rate=2.0)
    with pytest.raises(ValueError, match="max_concurrency caps an open loop"):
        LoadSpec(concurrency=2, max_concurrency=3)
    assert LoadSpec(request_rate=2.0, max_concurrency=4).label == "rps=2,max=4"
