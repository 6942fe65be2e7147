"""A load is capped to what its workload can carry, with one line saying so."""

import numpy as np

from kvbench.harness.possible_load import possible_load
from kvbench.measure.schedule import LoadSpec
from kvbench.workloads.spec import Session, Turn, Workload


def workload(sessions=10, turns=3):
    tokens = np.arange(4)
    return Workload(
        "tiny",
        tuple(
            Session(f"s{i}", "default", 0.0, tokens, tuple(Turn(tokens, 8) for _ in range(turns)))
            for i in range(sessions)
        ),
        vocab_size=100,
    )


def test_a_concurrency_past_the_sessions_is_capped_with_one_line():
    load, warnings = possible_load(LoadSpec(concurrency=512), workload())
    assert load.concurrency == 10
    assert warnings == (
        "tiny: concurrency 512 capped at 10: its 10 sessions have at most 10 requests in flight "
        "(more sessions: --num-sessions)",
    )
    capped, (line,) = possible_load(LoadSpec(rate=2.0, max_concurrency=64), workload())
    assert capped.max_concurrency == 10 and capped.rate == 2.0 and line.startswith("tiny: max_concurrency 64 capped")


def test_a_request_budget_past_the_workload_says_what_is_sent():
    load, warnings = possible_load(LoadSpec(concurrency=4, num_requests=50), workload(sessions=10, turns=3))
    assert load.num_requests == 30 and load.concurrency == 4
    assert warnings == (
        "tiny: 50 requests asked, its 10 sessions have 30: 30 are sent (more sessions: --num-sessions)",
    )


def test_a_load_the_workload_can_carry_is_left_alone():
    load = LoadSpec(concurrency=10, num_requests=30)
    assert possible_load(load, workload()) == (load, ())
