"""The load generator against the measurement instrument: injected timing in, the same timing measured out."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import numpy as np
import pytest

from kvbench.engines.kvengine.settings.tenants import TenantsConfig
from kvbench.harness.client import EndpointConfig
from kvbench.harness.instrument import (
    FAULT_DROP,
    FAULT_HTTP_500,
    FAULT_MALFORMED,
    FAULT_NO_HEADERS,
    FAULT_STALL,
    InstrumentBehaviour,
)
from kvbench.harness.loadgen import LoadGenerator
from kvbench.measure.conversation import Isolation
from kvbench.measure.metrics import (
    e2e_from_schedule_ms,
    e2e_ms,
    itl_ms,
    summarize,
    tpot_ms,
    ttft_from_schedule_ms,
    ttft_ms,
)
from kvbench.measure.records import ANSWER_PLACEHOLDER, ANSWER_TOKEN_IDS, RecordWriter, read_records
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload
from kvbench.workloads.spec import Session, Turn, Workload, token_array

from .instrument_fixture import serving
from .timing import EARLY_MS, MEDIAN_TTFT_LATE_MS, median_itl_ok, median_ttft_ok


def workload(sessions=1, turns=1, context=64, user=8, max_tokens=10, think=0.0, arrival_gap=0.0, tenants=("t",)):
    rng = np.random.default_rng(0)
    shared = token_array(rng.integers(1000, 30000, size=context))
    out = []
    for index in range(sessions):
        out.append(
            Session(
                session_id=f"s{index}",
                tenant=tenants[index % len(tenants)],
                arrival_s=index * arrival_gap,
                context=shared,
                turns=tuple(
                    Turn(token_array(rng.integers(1000, 30000, size=user)), max_tokens, think if k else 0.0)
                    for k in range(turns)
                ),
            )
        )
    return Workload(name="test", sessions=tuple(out), vocab_size=32000)


def run(behaviour, wl, load=LoadSpec(concurrency=1), **endpoint):
    async def go():
        async with serving(behaviour) as (url, log):
            generator = LoadGenerator(EndpointConfig(base_url=url, model="m", **endpoint), load, run_id="test")
            return await generator.run(wl), log

    return asyncio.run(go())


def test_measured_ttft_itl_tpot_equal_the_injected_timing():
    # Bounds: tests/harness/timing.py (the client's overhead measured under load).
    behaviour = InstrumentBehaviour(first_token_ms=60.0, chunk_interval_ms=90.0, tokens_per_chunk=3, cached_tokens=32)
    result, _ = run(behaviour, workload(sessions=4, max_tokens=12), LoadSpec(concurrency=2))
    assert len(result.records) == 4
    # Each request: the exact side (the instrument sleeps the injected time first) and the counts; the late side
    # is bounded on the medians, which one stalled request on a loaded machine cannot move past the bound.
    for rec in result.records:
        assert rec.ok, rec.error
        assert ttft_ms(rec) >= 60.0 - EARLY_MS
        assert (rec.done_ns - rec.sent_ns) / 1e6 >= 60.0 + 3 * 90.0 - EARLY_MS  # 4 chunks, 90 ms apart
        # 12 tokens in chunks of 3 every 90 ms: each chunk after the first adds 3 gaps of 30 ms
        assert len(itl_ms(rec)) == 9
        assert rec.output_tokens == 12
        assert rec.cached_tokens == 32
        assert rec.prompt_tokens == rec.prompt_len_sent == 72
    summary = summarize(result.records)
    assert median_ttft_ok(summary.ttft_ms.p50, 60.0) and median_itl_ok(summary.itl_ms.p50, 30.0)
    # (last chunk - first chunk) / (12 - 1) = 270 / 11 ms; each end's median lateness within the median bound
    tpot = float(np.median([tpot_ms(rec) for rec in result.records]))
    assert (270.0 - MEDIAN_TTFT_LATE_MS) / 11 <= tpot <= (270.0 + MEDIAN_TTFT_LATE_MS) / 11


def test_token_counts_come_from_usage_not_from_the_stream():
    # One chunk of 5 tokens without token ids: the stream alone would count it as 1 token.
    behaviour = InstrumentBehaviour(first_token_ms=5, tokens_per_chunk=5, return_token_ids=False)
    result, _ = run(behaviour, workload(max_tokens=5))
    (rec,) = result.records
    assert rec.output_tokens == 5
    assert summarize(result.records).output_tokens == 5
    assert rec.answer_source == ANSWER_PLACEHOLDER


def test_next_turn_carries_the_real_answer_tokens():
    behaviour = InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1, first_token_id=500)
    wl = workload(sessions=1, turns=3, max_tokens=4, think=0.01)
    result, log = run(behaviour, wl)
    prompts = [body["prompt"] for body in log.bodies]
    assert len(prompts) == 3
    session = wl.sessions[0]
    answer = [500, 501, 502, 503]
    assert prompts[0] == session.context.tolist() + session.turns[0].user_tokens.tolist()
    assert prompts[1] == prompts[0] + answer + session.turns[1].user_tokens.tolist()
    assert prompts[2] == prompts[1] + answer + session.turns[2].user_tokens.tolist()
    assert all(rec.answer_source == ANSWER_TOKEN_IDS for rec in result.records)
    # The oracle: turn 1 may reuse turn 0's prompt and all answer tokens the engine fed back (3 of 4).
    reusable = [rec.reusable_tokens for rec in sorted(result.records, key=lambda r: r.turn)]
    assert reusable == [0, len(prompts[0]) + 3, len(prompts[1]) + 3]
    body = log.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_think_time_is_kept_between_turns():
    behaviour = InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1)
    result, log = run(behaviour, workload(turns=3, max_tokens=2, think=0.15))
    # The next turn is due exactly the think time after the answer, and is never sent before it is due (how late
    # it goes on a loaded machine is the client's own check, the schedule lag).
    records = sorted(result.records, key=lambda r: r.turn)
    for previous, current in zip(records, records[1:]):
        assert current.planned_ns - previous.done_ns == 150_000_000
        assert current.sent_ns >= current.queued_ns >= current.planned_ns


def test_open_loop_schedule_is_kept():
    behaviour = InstrumentBehaviour(first_token_ms=300, chunk_interval_ms=5)  # slow answers must not delay sends
    wl = workload(sessions=12, max_tokens=3)
    load = LoadSpec(rate=40.0)

    result, _ = run(behaviour, wl, load)
    from kvbench.measure.schedule import session_offsets

    offsets = sorted(session_offsets(load, [0.0] * 12, seed=0))
    records = sorted(result.records, key=lambda rec: rec.planned_ns)
    planned = np.array([rec.planned_ns for rec in records])
    # Each session planned at its drawn offset (to the ns: the schedule's clock), never sent before it; the
    # sessions are planned over ~300 ms, so all at once, or at 10x the rate, is another plan.
    assert np.abs((planned - planned[0]) / 1e9 - offsets).max() < 1e-6
    assert all(rec.sent_ns >= rec.planned_ns for rec in records)
    assert offsets[-1] > 0.25
    # Slow answers do not delay sends: every answer takes >= 300 ms (injected), the sends come in ~300 ms.
    events = sorted([(rec.sent_ns, 1) for rec in records] + [(rec.done_ns, -1) for rec in records])
    assert max(itertools.accumulate(change for _, change in events)) >= 6
    # How late each went is the client's own check: its lags are those of the records.
    lags = [(rec.sent_ns - rec.queued_ns) / 1e6 for rec in records]
    assert result.client.schedule_lag_ms.n == 12 and result.client.schedule_lag_ms.max == pytest.approx(max(lags))


@pytest.mark.parametrize(
    "fault, after, kind",
    [
        (FAULT_HTTP_500, 0, "http"),
        (FAULT_MALFORMED, 1, "malformed_sse"),
        (FAULT_STALL, 2, "stalled"),
        (FAULT_DROP, 1, ""),
    ],
)
def test_faults_become_error_records_never_a_hang(fault, after, kind):
    behaviour = InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1, fault=fault, fault_after_chunks=after)
    result, _ = run(behaviour, workload(sessions=2, max_tokens=5), LoadSpec(concurrency=2), stall_timeout_s=0.5)
    assert len(result.records) == 2
    for rec in result.records:
        assert not rec.ok
        assert rec.error.startswith(kind), rec.error
    assert summarize(result.records).errors == 2


def test_a_failed_turn_ends_its_session_and_is_written(tmp_path):
    def behaviour(index, body):
        return InstrumentBehaviour(
            first_token_ms=2, chunk_interval_ms=1, fault=FAULT_HTTP_500 if index == 1 else "none"
        )

    path = tmp_path / "requests.jsonl"

    async def go():
        async with serving(behaviour) as (url, log):
            generator = LoadGenerator(EndpointConfig(base_url=url, model="m"), LoadSpec(concurrency=1), run_id="x")
            with RecordWriter(path) as writer:
                return await generator.run(workload(turns=4, max_tokens=2), writer)

    asyncio.run(go())
    on_disk = list(read_records(path))
    assert [rec.turn for rec in on_disk] == [0, 1]
    assert on_disk[0].ok and on_disk[1].error.startswith("http: 500")


def test_stop_conditions_and_warmup():
    behaviour = InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1)
    result, _ = run(
        behaviour,
        workload(sessions=10, turns=2, max_tokens=2),
        LoadSpec(concurrency=3, num_requests=7, warmup_requests=2),
    )
    assert len(result.records) == 7
    assert sum(rec.warmup for rec in result.records) == 2
    assert summarize(result.records).requests == 5


def test_each_tenant_sends_its_own_api_key():
    behaviour = InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1)
    wl = workload(sessions=4, max_tokens=2, tenants=("a", "b"))

    async def go():
        async with serving(behaviour) as (url, log):
            generator = LoadGenerator(
                EndpointConfig(base_url=url, model="m", api_key="default-key"),
                LoadSpec(concurrency=2),
                run_id="t",
                tenant_api_keys={"a": "key-a"},
            )
            await generator.run(wl)
            return log

    log = asyncio.run(go())
    assert sorted(log.keys) == ["Bearer default-key", "Bearer default-key", "Bearer key-a", "Bearer key-a"]


def test_a_server_that_sends_no_headers_times_out_and_aborts_the_run():
    # Every request hangs before its headers. Two in flight time out, two more are sent; the third timeout in a
    # row means the engine is hung: nothing more is sent, and the fourth gets a record only if its own timeout
    # came before the abort cancelled it.
    behaviour = InstrumentBehaviour(fault=FAULT_NO_HEADERS)
    result, log = run(behaviour, workload(sessions=10, max_tokens=2), LoadSpec(concurrency=2), header_timeout_s=0.3)
    assert len(log.bodies) == 4
    assert len(result.records) in (3, 4)
    assert {rec.error for rec in result.records} == {"timeout: no response headers within 0.3 s"}
    assert result.aborted.startswith("engine unreachable: 3 requests in a row got no answer")


def test_the_first_byte_has_its_own_timeout_and_later_silences_the_stall_timeout():
    def behaviour(index, body):
        after = 0 if index == 0 else 2  # the first request stalls before its first byte, the second after two chunks
        return InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1, fault=FAULT_STALL, fault_after_chunks=after)

    result, _ = run(behaviour, workload(sessions=2, max_tokens=5), first_byte_timeout_s=0.4, stall_timeout_s=0.2)
    errors = [rec.error for rec in sorted(result.records, key=lambda rec: rec.sent_ns)]
    assert errors == ["timeout: no first byte within 0.4 s of the response headers", "stalled: no bytes for 0.2 s"]
    assert result.aborted is None  # two failures in a row are not yet an unreachable engine


def test_a_resumed_run_sends_only_unfinished_turns_with_the_prompts_they_would_have_had():
    behaviour = InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1, first_token_id=700)
    wl = workload(sessions=3, turns=3, max_tokens=4)

    def play(finished=()):
        async def go():
            async with serving(behaviour) as (url, log):
                generator = LoadGenerator(EndpointConfig(base_url=url, model="m"), LoadSpec(concurrency=1), run_id="p")
                return await generator.run(wl, finished=finished), log

        result, log = asyncio.run(go())
        # One request at a time: the i-th body the instrument saw is the i-th record sent.
        sent = sorted(result.records, key=lambda rec: rec.sent_ns)
        return result, {rec.identity: body["prompt"] for rec, body in zip(sent, log.bodies)}

    whole, whole_prompts = play()
    finished = sorted(whole.records, key=lambda rec: rec.done_ns)[:4]  # what a kill after four answers leaves
    resumed, resumed_prompts = play(finished)
    assert sorted(rec.identity for rec in resumed.replayed) == sorted(rec.identity for rec in finished)
    unfinished = {rec.identity for rec in whole.records} - {rec.identity for rec in finished}
    assert resumed_prompts == {identity: whole_prompts[identity] for identity in unfinished}
    by_identity = {rec.identity: rec for rec in whole.records}
    for rec in resumed.records:
        assert rec.reusable_tokens == by_identity[rec.identity].reusable_tokens
        assert rec.answer_tokens == [700, 701, 702, 703]
    before, after = summarize(whole.records), summarize([*resumed.replayed, *resumed.records])
    assert (after.requests, after.completed, after.output_tokens) == (
        before.requests,
        before.completed,
        before.output_tokens,
    )
    assert after.cache == before.cache


PREAMBLE = 48  # tokens every tenant's prompts begin with, of which the tenants file declares the first DECLARED
DECLARED = 32


def multi_tenant_workload():
    """rag-chat-mt-mini (6 sessions, times scaled down) whose contexts all begin with the same preamble."""
    wl = load_workload("rag-chat-mt-mini", num_sessions=6, seed=5, time_scale=0.02)
    preamble = np.random.default_rng(1).integers(1000, wl.vocab_size, size=PREAMBLE)
    sessions = tuple(
        dataclasses.replace(s, context=token_array(np.concatenate([preamble, s.context]))) for s in wl.sessions
    )
    return dataclasses.replace(wl, sessions=sessions), tuple(int(t) for t in preamble[:DECLARED])


@pytest.mark.parametrize("isolation", [Isolation.STRICT, Isolation.SHARED_PREFIX])
def test_the_simulator_gives_the_load_generators_reusable_tokens_on_a_multi_tenant_workload(isolation):
    wl, declared = multi_tenant_workload()
    tenants = TenantsConfig(shared_prefixes=(declared,))
    # No token ids in the answers: both sides then carry the same placeholder answers of max_tokens tokens.
    behaviour = InstrumentBehaviour(first_token_ms=1, chunk_interval_ms=0, tokens_per_chunk=64, return_token_ids=False)
    load = LoadSpec(concurrency=1)

    async def go():
        async with serving(behaviour) as (url, _):
            generator = LoadGenerator(
                EndpointConfig(base_url=url, model="m"),
                load,
                run_id="real",
                isolation=isolation,
                shared_prefixes=tenants.shared_prefixes,
            )
            return await generator.run(wl)

    real = sorted(asyncio.run(go()).records, key=lambda rec: rec.sent_ns)
    config = SimConfig(
        load_geometry("qwen2.5-72b"),
        load_hardware("8xh200"),
        get_preset("vllm-prefix"),
        "fp8",
        "fp8",
        strict_isolation=isolation is Isolation.STRICT,
        tenants=tenants,
    )
    simulated = simulate(wl, load, config, send_order=[rec.request_id for rec in real]).records
    assert len(real) == wl.num_requests and all(rec.ok for rec in real)
    assert {rec.request_id: rec.reusable_tokens for rec in simulated} == {
        rec.request_id: rec.reusable_tokens for rec in real
    }
    # The rule was exercised: a tenant's first request finds only another tenant's prompts before it, and may
    # reuse nothing of them in strict isolation, the declared prefix (not the whole preamble) in shared-prefix.
    firsts = [next(rec for rec in real if rec.tenant == tenant) for tenant in dict.fromkeys(r.tenant for r in real)]
    assert len(firsts) >= 2
    assert [rec.reusable_tokens for rec in firsts[1:]] == [0 if isolation is Isolation.STRICT else DECLARED] * (
        len(firsts) - 1
    )


def test_ttft_from_schedule_equals_ttft_when_every_request_goes_when_planned():
    behaviour = InstrumentBehaviour(first_token_ms=30, chunk_interval_ms=5)
    result, _ = run(behaviour, workload(sessions=4, turns=2, max_tokens=4, think=0.02), LoadSpec(rate=10.0))
    for rec in result.records:  # nothing waits between plan and queue without a cap: the difference is the send's lag
        assert rec.planned_ns == rec.queued_ns <= rec.sent_ns
        assert ttft_from_schedule_ms(rec) - ttft_ms(rec) == pytest.approx((rec.sent_ns - rec.queued_ns) / 1e6)
        assert e2e_from_schedule_ms(rec) - e2e_ms(rec) == pytest.approx((rec.sent_ns - rec.queued_ns) / 1e6)


def test_ttft_from_schedule_counts_the_queueing_a_saturated_closed_loop_adds():
    # One slot, four requests due at once: the k-th one sent waits for k answers of 30 + 3 x 5 = 45 ms each.
    behaviour = InstrumentBehaviour(first_token_ms=30, chunk_interval_ms=5)
    result, _ = run(behaviour, workload(sessions=4, max_tokens=4), LoadSpec(concurrency=1))
    records = sorted(result.records, key=lambda rec: rec.sent_ns)
    assert len({rec.planned_ns for rec in records}) == 1  # all planned at the start
    for k, rec in enumerate(records):  # k answers of at least 45 ms each before it: the one slot frees in order
        assert k == 0 or rec.sent_ns >= records[k - 1].done_ns
        assert ttft_from_schedule_ms(rec) - ttft_ms(rec) == pytest.approx((rec.sent_ns - rec.planned_ns) / 1e6)
        assert ttft_from_schedule_ms(rec) - ttft_ms(rec) >= 45.0 * k - EARLY_MS * (k + 1)
        assert e2e_from_schedule_ms(rec) >= 45.0 * (k + 1) - EARLY_MS * (k + 1)
    summary = summarize(result.records)
    assert (
        summary.ttft_from_schedule_ms.max >= 3 * 45.0 + 30.0 - 4 * EARLY_MS
    )  # the last waited 3 answers, then its own
