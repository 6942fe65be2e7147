"""The most requests in flight at once, from the records' own send and done times."""

from kvbench.measure.metrics import peak_in_flight
from kvbench.measure.records import RequestRecord


def record(sent, done):
    return RequestRecord(
        run_id="r",
        request_id=f"q{sent}",
        session_id="s",
        tenant="a",
        turn=0,
        queued_ns=sent,
        sent_ns=sent,
        done_ns=done,
    )


def test_overlaps_count_and_an_end_frees_its_slot_before_a_start_at_the_same_instant():
    assert peak_in_flight([]) == 0
    assert peak_in_flight([record(0, 10), record(10, 20), record(20, 30)]) == 1  # back to back: one slot
    assert peak_in_flight([record(0, 10), record(5, 15), record(6, 7), record(12, 30)]) == 3
    assert peak_in_flight([record(0, None), record(100, 110)]) == 2  # never done: in flight to the end


def test_a_resumed_points_duration_is_the_time_each_sitting_ran():
    from kvbench.measure.metrics import played_duration_s

    s = 1_000_000_000
    first = [record(0, 2 * s), record(1 * s, 3 * s)]  # ran 3 s, then interrupted
    second = [record(12 * s, 14 * s), record(13 * s, 15 * s)]  # resumed 9 s later, ran 3 s
    assert played_duration_s(first + second) == 15.0  # the span, pause included
    assert played_duration_s(first + second, (12 * s,)) == 6.0
    assert played_duration_s([]) is None
