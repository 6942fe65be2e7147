"""The rag-chat generator: seeded determinism, stable content streams, sizes, Zipf reuse, tenants."""

import dataclasses

import numpy as np
import pytest

from kvbench.workloads.ragchat import RagChatParams, generate_rag_chat
from kvbench.workloads.spec import TenantSpec, WorkloadError
from kvbench.workloads.stats import workload_stats
from kvbench.workloads.tokens import safe_token_range

SMALL = RagChatParams(
    num_sessions=40,
    system_tokens=64,
    corpus_docs=50,
    docs_per_session=3,
    doc_tokens=32,
    user_tokens_mean=20.0,
    user_tokens_min=4,
    user_tokens_max=64,
    output_tokens_mean=16.0,
    output_tokens_min=2,
    output_tokens_max=64,
)


def all_tokens(workload):
    return [s.context for s in workload.sessions] + [t.user_tokens for s in workload.sessions for t in s.turns]


def same_workload(a, b):
    if len(a.sessions) != len(b.sessions):
        return False
    for x, y in zip(a.sessions, b.sessions):
        if (x.session_id, x.tenant, x.arrival_s, len(x.turns)) != (y.session_id, y.tenant, y.arrival_s, len(y.turns)):
            return False
        if not np.array_equal(x.context, y.context):
            return False
        for s, t in zip(x.turns, y.turns):
            if (s.max_tokens, s.think_time_s) != (t.max_tokens, t.think_time_s):
                return False
            if not np.array_equal(s.user_tokens, t.user_tokens):
                return False
    return True


def test_same_seed_gives_identical_ids_and_a_different_seed_different_ids():
    assert same_workload(generate_rag_chat(SMALL, seed=3), generate_rag_chat(SMALL, seed=3))
    a, b = generate_rag_chat(SMALL, seed=3), generate_rag_chat(SMALL, seed=4)
    assert not np.array_equal(a.sessions[0].context, b.sessions[0].context)
    assert not same_workload(a, b)


def test_sessions_do_not_change_when_the_session_count_changes():
    few = generate_rag_chat(dataclasses.replace(SMALL, num_sessions=5), seed=1)
    many = generate_rag_chat(dataclasses.replace(SMALL, num_sessions=30), seed=1)
    assert same_workload(few, dataclasses.replace(many, sessions=many.sessions[:5]))


def test_system_prompt_and_documents_recur_across_sessions():
    workload = generate_rag_chat(SMALL, seed=0)
    contexts = [s.context for s in workload.sessions]
    system = contexts[0][: SMALL.system_tokens]
    assert all(np.array_equal(c[: SMALL.system_tokens], system) for c in contexts)
    documents = {
        c[i : i + SMALL.doc_tokens].tobytes()
        for c in contexts
        for i in range(SMALL.system_tokens, len(c), SMALL.doc_tokens)
    }
    # 40 sessions x 3 documents drawn from 50 with Zipf popularity: far fewer distinct documents than draws.
    assert len(documents) < 40 * 3 / 2


def test_token_ids_stay_in_the_safe_range_of_the_vocabulary():
    params = dataclasses.replace(SMALL, vocab_size=4096)
    token_range = safe_token_range(4096)
    tokens = np.concatenate(all_tokens(generate_rag_chat(params, seed=0)))
    assert tokens.min() >= token_range.low and tokens.max() < token_range.high
    assert 0 < token_range.low and token_range.high < 4096


def test_sizes_follow_their_parameters_over_many_sessions():
    params = RagChatParams(
        num_sessions=3000,
        system_tokens=10,
        corpus_docs=20,
        docs_per_session=2,
        doc_tokens=5,
        turns_mean=6.0,
        turns_max=40,
        user_tokens_mean=200.0,
        output_tokens_mean=256.0,
        output_tokens_max=4096,
        think_time_median_s=30.0,
        think_time_sigma=1.5,
        think_time_max_s=7200.0,
        session_rate=2.0,
    )
    workload = generate_rag_chat(params, seed=0)
    turns = np.array([len(s.turns) for s in workload.sessions])
    user = np.array([len(t.user_tokens) for s in workload.sessions for t in s.turns])
    output = np.array([t.max_tokens for s in workload.sessions for t in s.turns])
    think = np.array([t.think_time_s for s in workload.sessions for t in s.turns[1:]])
    gaps = np.diff([s.arrival_s for s in workload.sessions])
    assert turns.mean() == pytest.approx(6.0, rel=0.05)
    assert turns.std() > 1  # a distribution, not a constant
    assert user.mean() == pytest.approx(200, rel=0.05)
    assert output.mean() == pytest.approx(256, rel=0.05)
    assert np.median(think) == pytest.approx(30, rel=0.1)
    assert np.percentile(think, 99) > 600  # a long tail: many minutes
    assert gaps.mean() == pytest.approx(0.5, rel=0.1)
    assert all(len(s.context) == 20 for s in workload.sessions)


def test_gamma_arrivals_have_the_requested_burstiness():
    bursty = dataclasses.replace(SMALL, num_sessions=4000, arrival_process="gamma", arrival_cv=3.0)
    gaps = np.diff([s.arrival_s for s in generate_rag_chat(bursty, seed=0).sessions])
    assert gaps.mean() == pytest.approx(1.0, rel=0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.15)


def test_reuse_grows_with_zipf_skew():
    rates = []
    for exponent in (0.0, 0.8, 1.6):
        # One turn per session, so that all reuse is across sessions (system prompt + shared leading documents).
        params = dataclasses.replace(
            SMALL,
            num_sessions=150,
            corpus_docs=200,
            docs_per_session=4,
            doc_tokens=64,
            zipf_exponent=exponent,
            turns_mean=1.0,
            turns_max=1,
        )
        rates.append(workload_stats(generate_rag_chat(params, seed=0)).oracle_hit_rate)
    assert rates[0] < rates[1] < rates[2]
    assert rates[2] - rates[0] > 0.2


def test_tenants_get_their_shares_and_their_own_content():
    tenants = (TenantSpec("big", 0.6, "premium"), TenantSpec("mid", 0.3), TenantSpec("small", 0.1))
    workload = generate_rag_chat(dataclasses.replace(SMALL, num_sessions=3000, tenants=tenants), seed=0)
    counts = {t.name: sum(s.tenant == t.name for s in workload.sessions) for t in tenants}
    assert counts["big"] / 3000 == pytest.approx(0.6, abs=0.03)
    assert counts["mid"] / 3000 == pytest.approx(0.3, abs=0.03)
    assert counts["small"] / 3000 == pytest.approx(0.1, abs=0.02)
    system = {s.tenant: s.context[: SMALL.system_tokens].tobytes() for s in workload.sessions}
    assert len(set(system.values())) == 3
    assert [t.tier for t in workload.tenants] == ["premium", "basic", "basic"]


def test_a_tenant_keeps_its_content_when_other_tenants_are_added():
    alone = generate_rag_chat(dataclasses.replace(SMALL, tenants=(TenantSpec("a"),)), seed=0)
    mixed = generate_rag_chat(dataclasses.replace(SMALL, tenants=(TenantSpec("a"), TenantSpec("b"))), seed=0)
    session = next(s for s in mixed.sessions if s.tenant == "a")
    assert np.array_equal(session.context[: SMALL.system_tokens], alone.sessions[0].context[: SMALL.system_tokens])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_sessions", 0, "num_sessions"),
        ("num_sessions", "3", "num_sessions"),
        ("arrival_process", "uniform", "arrival_process"),
        ("docs_per_session", 2000, "docs_per_session"),
        ("turns_mean", 0.5, "turns_mean"),
        ("user_tokens_mean", 5000.0, "user_tokens_mean"),
        ("vocab_size", 100, "vocab_size"),
        ("tenants", ({"name": "x", "tier": "gold"},), "tier"),
    ],
)
def test_invalid_parameters_name_the_field(field, value, message):
    with pytest.raises(WorkloadError, match=message):
        RagChatParams(**{field: value})


def test_replace_rejects_unknown_keys_naming_the_valid_ones():
    with pytest.raises(WorkloadError, match=r"unknown rag-chat parameter.*'sesions'.*valid keys.*num_sessions"):
        SMALL.replace({"sesions": 3})


def test_params_round_trip_through_plain_types():
    params = dataclasses.replace(SMALL, tenants=(TenantSpec("a", 0.7, "premium"), TenantSpec("b", 0.3)))
    assert RagChatParams().replace(params.to_dict()) == params
