"""Profiles and `load_workload`: names, files, overrides and the errors that name the valid choices."""

import json

import numpy as np
import pytest

from kvbench.workloads.profiles import PROFILES, load_workload
from kvbench.workloads.spec import WorkloadError
from kvbench.workloads.stats import workload_stats
from kvbench.workloads.tokens import safe_token_range


def test_rag_chat_has_the_article_sizes():
    workload = load_workload("rag-chat", num_sessions=200)
    params = workload.params
    assert (params["system_tokens"], params["docs_per_session"], params["doc_tokens"]) == (1536, 8, 1024)
    assert all(len(s.context) == 1536 + 8 * 1024 for s in workload.sessions)
    assert workload.num_requests / len(workload.sessions) == pytest.approx(6, rel=0.1)
    user = [len(t.user_tokens) for s in workload.sessions for t in s.turns]
    assert np.mean(user) == pytest.approx(200, rel=0.1)


def test_rag_chat_mini_fits_a_cpu_engine():
    workload = load_workload("rag-chat-mini")
    stats = workload_stats(workload)
    assert 30 <= stats.requests <= 50
    assert 300 <= stats.prompt_tokens.mean and stats.prompt_tokens.max <= 1600
    assert 8 <= stats.output_tokens.mean <= 60
    think = [t.think_time_s for s in workload.sessions for t in s.turns[1:]]
    assert 0.2 <= min(think) and max(think) <= 2.0
    assert stats.duration_s < 30


def test_rag_chat_mt_mixes_tiers_and_skewed_shares():
    workload = load_workload("rag-chat-mt", num_sessions=400)
    tiers = {t.tier for t in workload.tenants}
    shares = sorted((t.share for t in workload.tenants), reverse=True)
    assert tiers == {"premium", "basic"}
    assert shares[0] >= 2 * shares[-1] * 2
    per_tenant = {t.tenant: t.sessions for t in workload_stats(workload).per_tenant}
    assert max(per_tenant, key=per_tenant.get) == max(workload.tenants, key=lambda t: t.share).name


def test_unknown_name_lists_the_profiles():
    with pytest.raises(WorkloadError, match="unknown workload 'rag-chta'.*rag-chat-mini"):
        load_workload("rag-chta")


def test_unknown_override_lists_the_valid_keys():
    with pytest.raises(WorkloadError, match=r"\['think_time'\]; valid keys: .*think_time_median_s"):
        load_workload("rag-chat-mini", overrides={"think_time": 1.0})


def test_overrides_session_count_vocab_and_time_scale_apply():
    base = load_workload("rag-chat-mini", seed=5)
    changed = load_workload(
        "rag-chat-mini",
        seed=5,
        num_sessions=3,
        vocab_size=2048,
        time_scale=0.5,
        overrides={"user_tokens_mean": 20.0, "user_tokens_min": 10},
    )
    assert len(changed.sessions) == 3
    tokens = np.concatenate([s.context for s in changed.sessions])
    assert tokens.max() < safe_token_range(2048).high
    assert [s.arrival_s * 2 for s in changed.sessions] == pytest.approx([s.arrival_s for s in base.sessions[:3]])
    think = [t.think_time_s * 2 for s in changed.sessions for t in s.turns]
    assert think == pytest.approx([t.think_time_s for s in base.sessions[:3] for t in s.turns])
    assert max(think) > 0


def test_a_yaml_file_of_parameters_starts_from_a_profile(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "profile: rag-chat-mini\nnum_sessions: 4\ndoc_tokens: 100\n"
        "tenants:\n  - {name: a, share: 3, tier: premium}\n  - {name: b}\n"
    )
    workload = load_workload(str(path))
    assert workload.name == "mine"
    assert len(workload.sessions) == 4
    assert all(len(s.context) == 192 + 2 * 100 for s in workload.sessions)
    assert [t.tier for t in workload.tenants] == ["premium", "basic"]


def test_a_yaml_file_with_a_bad_key_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("docs: 3\n")
    with pytest.raises(WorkloadError, match=f"{path}: unknown rag-chat parameter"):
        load_workload(str(path))


def test_trace_paths_are_read_by_their_kind(tmp_path, mooncake_path):
    kvbench = tmp_path / "w.jsonl"
    kvbench.write_text(
        json.dumps({"session_id": "a", "turn": 0, "arrival_s": 0, "user_length": 9, "max_tokens": 2}) + "\n"
    )
    assert len(load_workload(str(kvbench)).sessions[0].turns[0].user_tokens) == 9
    mooncake = load_workload(str(mooncake_path), num_sessions=5, time_scale=2.0)
    assert len(mooncake.sessions) == 5 and mooncake.params["format"] == "mooncake"
    with pytest.raises(WorkloadError, match="traces take no overrides"):
        load_workload(str(kvbench), overrides={"doc_tokens": 3})
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(str(tmp_path / "missing.csv"))


def test_every_profile_loads():
    for name in PROFILES:
        assert load_workload(name, num_sessions=3).num_requests >= 3
