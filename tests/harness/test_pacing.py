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
from kvbench.harness.pacing import ArrivalGate
from kvbench.harness.workers import plan_jobs
from kvbench.measure.schedule import LoadSpec, request_gaps, split_schedule

from .instrument_fixture import serving
from .test_loadgen import workload
from .timing import EARLY_MS


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
    """Single-turn sessions at 40 requests/s: each request is planned at its drawn arrival (exactly: the gate's
    clock), never sent before it, and slow answers (200 ms) do not hold the next arrival back. How late a send is
    on a loaded machine is the client's own check (its lag numbers are those of the records), not this test's:
    benchmarks/timing_overhead.py measures it."""
    load = LoadSpec(request_rate=40.0, num_requests=30)
    result, _ = _play(
        InstrumentBehaviour(first_token_ms=200, chunk_interval_ms=5), workload(sessions=30, max_tokens=3), load, seed=3
    )
    planned = np.cumsum(list(itertools.islice(request_gaps(40.0, 1.0, 3), 30)))
    records = sorted(result.records, key=lambda r: r.planned_ns)
    assert len(records) == 30 and all(record.ok for record in records)
    planned_ns = np.array([record.planned_ns for record in records])
    assert np.abs((planned_ns - planned_ns[0]) / 1e9 - planned).max() < 1e-6  # the drawn arrivals, to the ns
    assert all(record.sent_ns >= record.planned_ns for record in records)  # never early
    assert planned[-1] > 0.3  # ~0.75 s planned: all at once, or at 10x the rate, is another schedule
    # Answers take >= 200 ms (injected): arrivals 25 ms apart are sent while earlier answers are still coming.
    assert _most_in_flight(records) >= 3
    assert result.missed_arrivals == 0
    lags = sorted((record.sent_ns - record.queued_ns) / 1e6 for record in records)
    assert result.client.schedule_lag_ms.max == pytest.approx(lags[-1])


@pytest.mark.parametrize(
    "load",
    [
        LoadSpec(request_rate=200.0, max_concurrency=3, num_requests=24),
        LoadSpec(rate=200.0, max_concurrency=3, num_requests=24),
        LoadSpec(request_rate=float("inf"), max_concurrency=3, num_requests=24),
    ],
    ids=["request-rate", "session-rate", "inf"],
)
def test_max_concurrency_caps_requests_in_flight_under_an_open_loop(load):
    """Arrivals far faster than 40 ms answers: without the cap ~8-24 would be in flight; with it never more than
    3 (and 3 is reached), and the waits behind the cap show in TTFT from schedule, not in TTFT (TTFT counts from
    the send, which comes after the slot: were it stamped before, more than 3 would look in flight).

    The wait is bounded below by the injected times alone, whatever the load: 24 requests through 3 slots of
    >= 42 ms answers (40 ms to the first token, 1 chunk gap of 2 ms) take >= 8 rounds, so the last one sent went
    >= 7 rounds after the first send (21 answers done before it, >= 7 in one slot), while it was planned at most
    the arrivals' span after the first plan."""
    from kvbench.measure.metrics import ttft_from_schedule_ms, ttft_ms

    result, log = _play(
        InstrumentBehaviour(first_token_ms=40, chunk_interval_ms=2), workload(sessions=24, max_tokens=2), load
    )
    records = sorted(result.records, key=lambda r: r.sent_ns)
    assert len(records) == 24 and all(record.ok for record in records)
    assert _most_in_flight(records) == 3
    assert len(log.arrivals_ns) == 24
    assert all(ttft_ms(r) >= 40.0 - EARLY_MS for r in records)
    answer_ms = 40.0 + 2.0 - 2 * EARLY_MS
    planned_span_ms = (max(r.planned_ns for r in records) - min(r.planned_ns for r in records)) / 1e6
    assert planned_span_ms < 4 * answer_ms  # so the bound below is >= 3 answers (200/s: ~140 ms of arrivals)
    waited_ms = max(ttft_from_schedule_ms(r) - ttft_ms(r) for r in records)
    assert waited_ms >= 7 * answer_ms - planned_span_ms


class StepTimer:
    """A timer the test moves by hand: `sleep_until` waits until `advance_to` passes its target (no wall clock)."""

    def __init__(self) -> None:
        self.sleepers: list[tuple[int, asyncio.Future]] = []

    async def sleep_until(self, target_ns: int) -> None:
        future = asyncio.get_running_loop().create_future()
        self.sleepers.append((target_ns, future))
        await future

    async def advance_to(self, now_ns: int) -> None:
        await self.settle()
        for target_ns, future in [pair for pair in self.sleepers if pair[0] <= now_ns]:
            self.sleepers.remove((target_ns, future))
            future.set_result(None)
        await self.settle()

    @staticmethod
    async def settle() -> None:
        for _ in range(20):  # let every runnable task (and those it wakes) run to its next wait
            await asyncio.sleep(0)


def test_an_arrival_lets_a_sessions_ready_next_turn_through_before_a_new_sessions_first():
    """The arrival gate's rule, on a hand-moved clock (arrivals 100 ms apart): three sessions wait with their
    first turns; s0 goes at the first arrival; once s0's next turn is ready it takes the second arrival ahead of
    s1 and s2, which have waited longer; an arrival finding nobody ready is missed."""

    async def go():
        timer = StepTimer()
        gate = ArrivalGate(itertools.chain([0.0], itertools.repeat(0.1)), t0_ns=0, timer=timer, may_send=lambda: True)
        admitted: list[tuple[str, int]] = []

        async def turn(name: str, first: bool) -> None:
            admission = await gate.enter(0, first_turn=first)
            admitted.append((name, admission.planned_ns))
            gate.leave()

        tasks = [asyncio.create_task(turn(f"s{i}/0", True)) for i in range(3)]
        await timer.advance_to(0)
        assert admitted == [("s0/0", 0)]
        tasks.append(asyncio.create_task(turn("s0/1", False)))  # s0 answered: its next turn is ready
        for arrival in (1, 2, 3):
            await timer.advance_to(arrival * 100_000_000)
        assert admitted == [("s0/0", 0), ("s0/1", 100_000_000), ("s1/0", 200_000_000), ("s2/0", 300_000_000)]
        await timer.advance_to(400_000_000)  # nobody is ready
        assert gate.missed == 1
        gate.close()
        await asyncio.gather(*tasks)

    asyncio.run(go())


def test_a_sessions_next_turn_takes_an_arrival_before_a_new_session_starts():
    """End to end through the load generator: multi-turn sessions at a request rate slower than the answers
    (burstiness 400: gaps of 100 ms +- 5 ms against ~3 ms answers). Wherever a session's next turn was ready
    (its previous answer done) well before an arrival, that arrival did not open a new session. "Well before":
    50 ms, so that a stall between the answer's end and its next turn reaching the gate cannot decide it; on an
    idle machine every arrival is checked (the rule itself: the test above, on a hand-moved clock)."""
    result, _ = _play(
        InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1),
        workload(sessions=3, turns=3, max_tokens=2),
        LoadSpec(request_rate=10.0, burstiness=400.0),
        seed=1,
    )
    records = result.records
    assert sorted((r.session_id, r.turn) for r in records) == [(f"s{s}", t) for s in range(3) for t in range(3)]
    done = {(r.session_id, r.turn): r.done_ns for r in records}
    for first in (r for r in records if r.turn == 0):
        ready_before = [
            r
            for r in records
            if r.turn > 0
            and r.planned_ns > first.planned_ns
            and done[(r.session_id, r.turn - 1)] < first.planned_ns - 50_000_000
        ]
        assert ready_before == [], f"{first.session_id} opened while {[r.identity for r in ready_before]} was ready"
    for session in ("s0", "s1", "s2"):  # each session's turns in order
        turns = sorted((r for r in records if r.session_id == session), key=lambda r: r.planned_ns)
        assert [r.turn for r in turns] == [0, 1, 2]


def test_the_request_budget_ends_a_request_rate_point_with_sessions_still_waiting():
    result, _ = _play(
        InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1),
        workload(sessions=200, max_tokens=2),
        LoadSpec(request_rate=100.0, num_requests=5),
    )
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
