"""The client's lag bound is relative to what the point measured: 10 ms floor, 5% of its TTFT p50 above that."""

from kvbench.harness.client_check import check_lags, lag_bound_ms
from kvbench.measure.schedule import MODE_CONCURRENCY, MODE_RATE


def test_the_bound_is_the_floor_or_five_percent_of_the_ttft():
    assert lag_bound_ms(10.0, None) == 10.0
    assert lag_bound_ms(10.0, 50.0) == 10.0  # 5% of 50 ms is 2.5 ms: the floor holds
    assert lag_bound_ms(10.0, 500.0) == 25.0
    assert lag_bound_ms(10.0, 10_000.0) == 500.0


def test_a_25_ms_lag_voids_a_50_ms_ttft_but_not_a_600_ms_one():
    lags = [25.0] * 100
    fast = check_lags(lags, lags, 10.0, MODE_RATE, ttft_p50_ms=50.0)
    assert not fast.valid and fast.reason == "schedule lag p99 25.00 ms > 10 ms"
    slow = check_lags(lags, lags, 10.0, MODE_RATE, ttft_p50_ms=600.0)
    assert slow.valid and slow.lag_bound_ms == 30.0 and slow.to_dict()["lag_bound_ms"] == 30.0
    late = check_lags([0.0], [40.0] * 10, 10.0, MODE_CONCURRENCY, ttft_p50_ms=600.0)
    assert late.reason == "event-loop lag p99 40.00 ms > 30 ms (5% of TTFT p50)"
