"""The shared_prefix generator: inference-perf's token counts and group structure, as token ids."""

import numpy as np
import pytest

from kvbench.workloads.profiles import load_workload
from kvbench.workloads.shared_prefix import SharedPrefixParams, generate_shared_prefix
from kvbench.workloads.spec import WorkloadError

PARAMS = SharedPrefixParams(
    num_groups=3, num_prompts_per_group=4, system_prompt_len=40, question_len=12, output_len=7, num_requests=30
)


def prompt(session) -> np.ndarray:
    return np.concatenate([session.context, session.turns[0].user_tokens])


def test_token_counts_are_the_parameters():
    workload = generate_shared_prefix(PARAMS, seed=1)
    assert len(workload.sessions) == 30 and workload.num_requests == 30
    for s in workload.sessions:
        assert len(s.turns) == 1 and s.turns[0].max_tokens == 7
        assert len(s.context) == 40 and len(s.turns[0].user_tokens) == 12
    assert workload.params["generator"] == "shared_prefix" and workload.params["num_groups"] == 3


def test_groups_share_their_system_prompt_and_nothing_else():
    sessions = generate_shared_prefix(PARAMS, seed=1).sessions
    first_pass = sessions[:12]  # one pass over the 3 x 4 prompts
    systems = {s.context.tobytes() for s in first_pass}
    questions = {s.turns[0].user_tokens.tobytes() for s in first_pass}
    assert len(systems) == 3 and len(questions) == 12  # every (group, question) exactly once
    for system in systems:
        members = [s for s in first_pass if s.context.tobytes() == system]
        assert len(members) == 4
    by_system = [s.context for s in first_pass]
    # Different groups differ from their first tokens on (no accidental shared prefix across groups).
    distinct = {c[:8].tobytes() for c in by_system}
    assert len(distinct) == 3
    # Request i + 12 sends request i's prompt again (the shuffled prompts cycle), and the order is shuffled:
    for i in range(12, 30):
        assert np.array_equal(prompt(sessions[i]), prompt(sessions[i - 12]))
    groups = [sorted(systems).index(s.context.tobytes()) for s in first_pass]
    assert groups != sorted(groups)


def test_same_seed_same_ids_other_seed_other_ids():
    a = generate_shared_prefix(PARAMS, seed=1).sessions
    b = generate_shared_prefix(PARAMS, seed=1).sessions
    c = generate_shared_prefix(PARAMS, seed=2).sessions
    assert all(np.array_equal(prompt(x), prompt(y)) for x, y in zip(a, b))
    assert not np.array_equal(prompt(a[0]), prompt(c[0]))


def test_loaded_by_name_and_from_a_parameter_file(tmp_path):
    named = load_workload("shared-prefix", num_sessions=5)
    assert len(named.sessions) == 5 and len(named.sessions[0].context) == 6000
    assert len(named.sessions[0].turns[0].user_tokens) == 1200 and named.sessions[0].turns[0].max_tokens == 1000
    path = tmp_path / "sp.yaml"
    path.write_text(
        "generator: shared_prefix\nnum_groups: 2\nnum_prompts_per_group: 3\nsystem_prompt_len: 16\n"
        "question_len: 4\noutput_len: 2\n"
    )
    loaded = load_workload(str(path))
    assert len(loaded.sessions) == 6 and len(loaded.sessions[0].context) == 16
    path.write_text("generator: shared_prefix\nnum_group: 2\n")
    with pytest.raises(WorkloadError, match="num_group.*valid keys"):
        load_workload(str(path))
    with pytest.raises(WorkloadError, match="question_len"):
        SharedPrefixParams(question_len=-1)
