"""Load stages: parsing, request counts, the boundaries between stages and the warm-up's exclusion."""

import numpy as np
import pytest

from kvbench.measure.stages import Stage, StagePlan, parse_stage, parse_stages


def test_parse_and_request_counts():
    assert parse_stages("3:20, 10:2.5") == (Stage(3.0, 20.0), Stage(10.0, 2.5))
    assert parse_stage("15:50").requests == 750 and Stage(10, 2.5).requests == 25
    for bad in ("3", "a:20", "0:20", "3:-1", ""):
        with pytest.raises(ValueError, match="stage"):
            parse_stages(bad)


def test_stage_boundaries_and_warmup():
    plan = StagePlan((Stage(1, 3), Stage(2, 2)), warmup=Stage(1, 2))  # 2 warm-up, then 3 and 4 requests
    assert plan.total_requests == 9 and plan.warmup_requests == 2
    assert plan.first_request() == [0, 2, 5, 9]
    assert [plan.stage_of(i) for i in range(10)] == [None, None, 0, 0, 0, 1, 1, 1, 1, None]
    arrivals = plan.arrivals(seed=4)
    assert [len(a) for a in arrivals] == [2, 3, 4]
    assert all(a[0] == 0 and np.all(np.diff(a) >= 0) for a in arrivals)
    no_warmup = StagePlan((Stage(1, 3),))
    assert [no_warmup.stage_of(i) for i in range(4)] == [0, 0, 0, None]


def test_poisson_gaps_have_the_stage_rate():
    gaps = np.diff(StagePlan((Stage(50, 400),)).arrivals(seed=1)[0])
    assert abs(gaps.mean() - 1 / 50) < 0.002 and abs(gaps.std() / gaps.mean() - 1) < 0.05


def test_each_measured_stage_is_a_point_and_the_first_plays_the_warmup_before_it():
    plan = StagePlan((Stage(1, 3), Stage(2, 2)), warmup=Stage(1, 2))  # 2 warm-up, then 3 and 4 requests
    first, second = plan.points()
    assert [part.first for part in first.parts(seed=4)] == [0, 2] and [part.first for part in second.parts(4)] == [5]
    assert [part.warmup for part in first.parts(4)] == [True, False] and not second.parts(4)[0].warmup
    assert [len(part.offsets) for part in (*first.parts(4), *second.parts(4))] == [2, 3, 4]
    # The same arrivals the simulator plays (StagePlan.arrivals), stage by stage.
    assert [list(part.offsets) for part in (*first.parts(4), *second.parts(4))] == [list(a) for a in plan.arrivals(4)]
    assert (first.keeps_cache, second.keeps_cache) == (False, True)
    assert first.stage == Stage(1, 3) and StagePlan((Stage(2, 1),)).points()[0].parts(0)[0].first == 0
    with pytest.raises(ValueError, match="the stages send 9 requests but the workload has 8 sessions"):
        plan.require_sessions(8)
    plan.require_sessions(9)
