"""The metric dictionary on hand-checked records."""

import pytest

from kvbench.measure.answer import FailureKind
from kvbench.measure.metrics import (
    SLO,
    cache_accounting,
    failure_reason,
    itl_ms,
    jain_fairness,
    summarize,
    summarize_run,
    tpot_ms,
)
from kvbench.measure.records import RequestRecord

MS = 1_000_000


def record(
    tenant="a",
    sent=0,
    first=100,
    chunks=((100, 1), (110, 1), (130, 2)),
    done=130,
    prompt=100,
    output=4,
    cached=None,
    reusable=0,
    error=None,
    warmup=False,
    rid="r",
    kind=None,
):
    return RequestRecord(
        run_id="run",
        request_id=rid,
        session_id="s",
        tenant=tenant,
        turn=0,
        queued_ns=sent * MS,
        sent_ns=sent * MS,
        first_token_ns=first * MS if first is not None else None,
        done_ns=done * MS if done is not None else None,
        chunks=[[t * MS, n] for t, n in chunks],
        prompt_tokens=prompt,
        output_tokens=output,
        cached_tokens=cached,
        reusable_tokens=reusable,
        error=error,
        error_kind=kind,
        warmup=warmup,
    )


def test_itl_splits_a_multi_token_chunk_into_equal_gaps():
    # gaps: 110-100 = 10 ms for 1 token; 130-110 = 20 ms carrying 2 tokens -> two gaps of 10 ms
    assert itl_ms(record()) == [10.0, 10.0, 10.0]


def test_tpot_and_ttft():
    rec = record(sent=0, first=100, done=130, output=4)
    assert tpot_ms(rec) == pytest.approx(10.0)  # (130 - 100) / (4 - 1)
    assert tpot_ms(record(output=1, chunks=((100, 1),))) is None
    summary = summarize([rec])
    assert summary.ttft_ms.p50 == pytest.approx(100.0)


def test_recompute_and_hit_rates_hand_checked():
    records = [
        record(prompt=100, cached=0, reusable=0, rid="1"),  # cold
        record(prompt=200, cached=64, reusable=100, rid="2"),  # 36 of 100 reusable tokens recomputed
        record(prompt=300, cached=250, reusable=200, rid="3"),  # cached beyond the oracle: 0 recomputed, not -50
    ]
    cache = cache_accounting(records)
    assert cache.prompt_tokens == 600
    assert cache.cached_tokens == 314
    assert cache.reusable_tokens == 300
    assert cache.recomputed_reusable_tokens == 36
    assert cache.prefill_recompute_rate == pytest.approx(36 / 300)
    assert cache.cache_hit_rate == pytest.approx(314 / 600)
    assert cache.oracle_hit_rate == pytest.approx(300 / 600)


def test_missing_cached_tokens_is_missing_not_zero():
    cache = cache_accounting([record(cached=None, reusable=50), record(cached=10, reusable=50, rid="2")])
    assert cache.cached_tokens is None
    assert cache.cache_hit_rate is None
    assert cache.prefill_recompute_rate is None
    assert cache.oracle_hit_rate == pytest.approx(100 / 200)


def test_warmup_and_errors_are_separated():
    records = [
        record(warmup=True, rid="w"),
        record(rid="ok"),
        record(error="http: 500", kind=FailureKind.HTTP, first=None, done=None, rid="e"),
    ]
    summary = summarize(records)
    assert summary.requests == 2
    assert summary.completed == 1
    assert summary.errors == 1
    assert summary.error_kinds == {"http": 1}


def test_throughput_window_and_goodput():
    records = [
        record(sent=0, first=100, done=200, output=10, chunks=((100, 1), (200, 9)), rid="1"),
        record(sent=100, first=700, done=1000, output=10, chunks=((700, 1), (1000, 9)), rid="2"),
    ]
    summary = summarize(records, slo=SLO(ttft_ms=500))
    assert summary.duration_s == pytest.approx(1.0)
    assert summary.output_tok_s == pytest.approx(20.0)
    assert summary.total_tok_s == pytest.approx(220.0)
    assert summary.req_s == pytest.approx(2.0)
    assert summary.goodput_req_s == pytest.approx(1.0)  # the second request's TTFT is 600 ms
    assert summary.slo_attainment == pytest.approx(0.5)


def test_jain_fairness_and_per_tenant():
    assert jain_fairness([10, 10, 10]) == pytest.approx(1.0)
    assert jain_fairness([30, 0, 0]) == pytest.approx(1 / 3)
    records = [
        record(tenant="a", first=100, rid="1"),
        record(tenant="b", first=300, done=330, chunks=((300, 1), (330, 3)), rid="2"),
    ]
    run = summarize_run(records)
    assert [summary.tenant for summary in run.per_tenant] == ["a", "b"]
    assert run.ttft_fairness == pytest.approx((100 + 300) ** 2 / (2 * (100**2 + 300**2)))


def _records_with_errors(total: int, errors: list[str]) -> list[RequestRecord]:
    records = [RequestRecord("r", f"s{i}/0", f"s{i}", "t", 0, queued_ns=0) for i in range(total)]
    for record, error in zip(records, errors):
        record.error = error
    return records


def test_failure_reason_allows_the_stated_share_and_names_the_most_frequent_error():
    assert failure_reason(_records_with_errors(10, ["http: 500 boom"]), 0.1) is None  # 10% is not more than 10%
    assert failure_reason(_records_with_errors(10, ["http: 500 a", "http: 500 a", "timeout: t"]), 0.1) == (
        "3/10 requests failed (limit 10%): most often (2x): http: 500 a"
    )
    assert failure_reason(_records_with_errors(4, ["http: 404 nope"] * 4), 1.0) == (
        "4/4 requests failed (limit 100%): http: 404 nope"
    )  # all of them, whatever the limit
    assert failure_reason([], 0.1) == "no request was sent"
