"""The driver's one schedule dealt to load workers: whole sessions, exact splits."""

from __future__ import annotations

import pytest

from kvbench.measure.schedule import LoadSpec, session_offsets, split_exactly, split_schedule


def test_split_exactly_sums_to_the_total_and_follows_the_weights():
    assert split_exactly(10, [1, 1, 1]) == [4, 3, 3]
    assert split_exactly(7, [3, 1]) == [5, 2]
    assert split_exactly(3, [0, 5]) == [0, 3]
    assert split_exactly(5, [0, 0]) == [0, 0]


def test_every_session_goes_whole_to_one_worker_with_the_offset_the_driver_drew():
    load = LoadSpec(rate=4.0)
    offsets = session_offsets(load, [0.0] * 7, seed=3)
    shares = split_schedule(load, offsets, [2] * 7, workers=3)
    dealt = sorted(index for share in shares for index in share.sessions)
    assert dealt == list(range(7))
    for share in shares:
        assert share.offsets == tuple(offsets[index] for index in share.sessions)
        assert list(share.offsets) == sorted(share.offsets)  # each worker's arrivals in schedule order
    # Round-robin in start order: the first three arrivals go to three different workers.
    first_three = sorted(range(7), key=lambda index: offsets[index])[:3]
    assert {next(s.worker for s in shares if index in s.sessions) for index in first_three} == {0, 1, 2}


def test_closed_loop_concurrency_budget_and_warmup_are_split_exactly():
    load = LoadSpec(concurrency=5, num_requests=11, warmup_requests=3)
    shares = split_schedule(load, [0.0] * 6, [1, 3, 1, 3, 1, 3], workers=2)
    assert [share.load.concurrency for share in shares] == [3, 2]
    assert sum(share.load.num_requests for share in shares) == 11
    assert sum(share.load.warmup_requests for share in shares) == 3
    # Worker 0 holds sessions 0, 2, 4 (3 turns), worker 1 sessions 1, 3, 5 (9 turns): the budget follows.
    assert [share.load.num_requests for share in shares] == [3, 8]


def test_no_more_workers_than_sessions_or_slots():
    assert len(split_schedule(LoadSpec(concurrency=2), [0.0] * 10, [1] * 10, workers=4)) == 2
    assert len(split_schedule(LoadSpec(rate=1.0), [0.0, 1.0], [1, 1], workers=4)) == 2
    with pytest.raises(ValueError, match="workers must be >= 1"):
        split_schedule(LoadSpec(), [0.0], [1], workers=0)
