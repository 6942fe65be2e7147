"""workload_stats: exact numbers on a hand-built workload, placeholder answers, per-tenant hit rates."""

import pytest

from kvbench.workloads.spec import Session, TenantSpec, Turn, Workload, token_array
from kvbench.workloads.stats import planned_requests, workload_stats


def test_hand_built_workload_counts_and_hit_rate():
    shared = list(range(1000, 1100))  # 100 tokens both sessions of tenant a start with
    sessions = (
        Session(
            "s1",
            "a",
            0.0,
            token_array(shared),
            (Turn(token_array([1, 2]), 10), Turn(token_array([3]), 5, think_time_s=4.0)),
        ),
        Session("s2", "a", 1.0, token_array(shared + [7]), (Turn(token_array([]), 20),)),
        Session("s3", "b", 2.0, token_array(shared), (Turn(token_array([1, 2]), 10),)),
    )
    workload = Workload("w", sessions, 32000, (TenantSpec("a", 0.5, "premium"), TenantSpec("b", 0.5)))
    stats = workload_stats(workload)
    # Send order: s1 t0 @0 (102 tokens), s2 @1 (101), s3 @2 (102, tenant b), s1 t1 @4 (102 + 10 + 1 = 113).
    # Reusable: 0, 100 (shared), 0 (other tenant), 102 (s1's first prompt).
    assert [len(r.prompt) for r in planned_requests(workload)] == [102, 101, 102, 113]
    assert (stats.sessions, stats.requests, stats.tenants) == (3, 4, 2)
    assert stats.prompt_tokens_total == 418
    assert stats.reusable_tokens_total == 202
    assert stats.oracle_hit_rate == pytest.approx(202 / 418)
    assert stats.prompt_tokens.max == 113 and stats.output_tokens.mean == pytest.approx(45 / 4)
    assert stats.duration_s == 4.0
    a, b = stats.per_tenant
    assert (a.tenant, a.tier, a.sessions, a.requests, a.prompt_tokens_total, a.reusable_tokens_total) == (
        "a",
        "premium",
        2,
        3,
        316,
        202,
    )
    assert (b.tenant, b.oracle_hit_rate) == ("b", 0.0)
    assert stats.to_dict()["per_tenant"][0]["tenant"] == "a"


def test_placeholder_answers_sit_between_turns_and_are_deterministic():
    session = Session(
        "s",
        "a",
        0.0,
        token_array([5, 5]),
        (Turn(token_array([1]), 3), Turn(token_array([2]), 4, 1.0), Turn(token_array([9]), 1, 1.0)),
    )
    workload = Workload("w", (session,), 32000)
    first, second, third = (r.prompt for r in planned_requests(workload))
    assert first.tolist() == [5, 5, 1]
    assert second[:3].tolist() == [5, 5, 1] and len(second) == 3 + 3 + 1 and second[-1] == 2
    assert third[: len(second)].tolist() == second.tolist() and len(third) == 7 + 4 + 1
    again = [r.prompt.tolist() for r in planned_requests(workload)]
    assert again[2] == third.tolist()


def test_an_empty_workload_reports_missing_not_zero():
    stats = workload_stats(Workload("empty", (), 32000))
    assert stats.oracle_hit_rate is None and stats.prompt_tokens is None and stats.requests == 0
