"""The conversation driver: prompts carry the real answers, the budget and warmup are counted once, and the
oracle follows the engine's isolation rule (hand-checked prefixes in each mode)."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.engines.kvengine.core.namespaces import shared_tokens_of
from kvbench.measure.answer import Answer
from kvbench.measure.conversation import (
    ConversationDriver,
    Isolation,
    ReuseOracle,
    declared_prefix_ids,
    declared_shared_tokens,
)
from kvbench.measure.record_builder import NextTurn, build_record
from kvbench.measure.records import ANSWER_TOKEN_IDS
from kvbench.measure.schedule import LoadSpec
from kvbench.workloads.spec import Session, Turn, token_array

COMMON = [1, 2, 3, 4, 5, 6, 7, 8]  # every tenant's prompts begin with these
DECLARED = (1, 2, 3, 4)  # ... of which the tenants file declares the first four shareable


def replay(isolation: Isolation, prompts: list[tuple[str, list[int]]], declared=(DECLARED,)) -> list[int]:
    oracle = ReuseOracle.following(isolation, declared)
    return [oracle.observe(tenant, np.asarray(tokens, dtype=np.int32)) for tenant, tokens in prompts]


PROMPTS = [("a", COMMON + [10, 11]), ("b", COMMON + [20, 21]), ("a", COMMON + [10, 12]), ("b", COMMON + [30])]


def test_strict_reuses_only_the_same_tenants_prompts():
    # b's first prompt shares 8 tokens with a's, but nothing crosses tenants; a's second reuses a's first (9).
    assert replay(Isolation.STRICT, PROMPTS) == [0, 0, 9, 8]


def test_shared_prefix_reuses_across_tenants_only_the_declared_prefix():
    # b may reuse a's declared 4 tokens, not the other 4 common ones; within a tenant everything as in strict.
    assert replay(Isolation.SHARED_PREFIX, PROMPTS) == [0, 4, 9, 8]


def test_shared_prefix_without_declared_prefixes_is_strict():
    assert replay(Isolation.SHARED_PREFIX, PROMPTS, declared=()) == replay(Isolation.STRICT, PROMPTS)


def test_shared_all_reuses_every_tenants_prompts():
    assert replay(Isolation.SHARED_ALL, PROMPTS) == [0, 8, 9, 8]


def test_a_prompt_matching_part_of_a_declared_prefix_shares_that_part():
    # Declared 1..4, 99: the prompts agree with it on 4 tokens only, and share exactly those.
    assert replay(Isolation.SHARED_PREFIX, PROMPTS[:2], declared=(DECLARED + (99,),)) == [0, 4]


def test_declared_shared_tokens_follows_the_engines_rule():
    rng = np.random.default_rng(0)
    for _ in range(200):
        prompt = rng.integers(0, 3, size=int(rng.integers(1, 12))).astype(np.int32)
        prefixes = tuple(
            rng.integers(0, 3, size=int(rng.integers(1, 12))).astype(np.int32) for _ in range(int(rng.integers(0, 3)))
        )
        assert declared_shared_tokens(prompt, prefixes) == shared_tokens_of(prompt, prefixes)


def test_text_prefixes_need_a_tokenizer_and_only_shared_prefix_reads_them():
    with pytest.raises(
        ValueError, match=r"shared_prefixes\[1\]: the text 'You are' needs the served model's tokenizer"
    ):
        ReuseOracle.following(Isolation.SHARED_PREFIX, [(1, 2), "You are"])
    encode = {"You are": [7, 8]}.__getitem__
    assert [p.tolist() for p in declared_prefix_ids([(1, 2), "You are"], encode)] == [[1, 2], [7, 8]]
    assert ReuseOracle.following(Isolation.STRICT, ["You are"]).shared_prefixes == ()


def test_isolation_names():
    assert Isolation.parse("shared-prefix") is Isolation.SHARED_PREFIX
    assert Isolation.parse("shared") is Isolation.SHARED_ALL  # the harness's name before shared-prefix existed
    with pytest.raises(ValueError, match="isolation: unknown 'private'; use strict, shared-prefix, shared-all"):
        Isolation.parse("private")


def session(turns=3) -> Session:
    return Session(
        "s0",
        "t",
        0.0,
        token_array([1, 2, 3]),
        tuple(Turn(token_array([10 * (k + 1)] * 2), 4, 0.5 * k) for k in range(turns)),
    )


def test_the_prompt_of_turn_k_carries_every_earlier_answer_and_the_oracle_sees_it():
    driver = ConversationDriver("run", LoadSpec(concurrency=1))
    talk = driver.start(session())
    first = talk.ask(queued_ns=5)
    assert first.prompt.tolist() == [1, 2, 3, 10, 10]
    assert (first.asked.request_id, first.asked.queued_ns, first.asked.reusable_tokens) == ("s0/0", 5, 0)
    assert talk.think_time_s == 0.5
    talk.answered(np.array([7, 8, 9], dtype=np.int32))
    second = talk.ask(queued_ns=6)
    assert second.prompt.tolist() == [1, 2, 3, 10, 10, 7, 8, 9, 20, 20]
    # The engine computed KV for the first prompt and every answer token but the last it sampled.
    assert second.asked.reusable_tokens == 7
    assert (second.turn, second.asked.turn, second.asked.prompt_len_sent) == (1, 1, 10)


def test_budget_warmup_and_replay_are_counted_once():
    driver = ConversationDriver("run", LoadSpec(concurrency=1, num_requests=3, warmup_requests=2))
    whole = driver.start(session())
    asks = []
    for _ in range(3):
        asks.append(whole.ask(0))
        whole.answered(np.array([5, 6], dtype=np.int32))
    assert [a.asked.warmup for a in asks] == [True, True, False]
    assert not driver.may_send(0.0) and whole.finished
    # A resumed run replays the first two turns from their records: the third gets the same prompt and reuse.
    resumed = ConversationDriver("run", LoadSpec(concurrency=1, num_requests=3, warmup_requests=2))
    talk = resumed.start(session())
    for a in asks[:2]:
        talk.replay(build_record(a.asked, Answer(sent_ns=0, done_ns=1), NextTurn(ANSWER_TOKEN_IDS, [5, 6])))
    third = talk.ask(0)
    assert third.prompt.tolist() == asks[2].prompt.tolist()
    assert third.asked.reusable_tokens == asks[2].asked.reusable_tokens
    assert not resumed.may_send(0.0)


def test_duration_stops_asking():
    driver = ConversationDriver("run", LoadSpec(rate=1.0, duration_s=2.0))
    assert driver.may_send(1.999) and not driver.may_send(2.0)


def test_the_oracle_has_a_rule_for_every_isolation_mode_of_our_engine():
    """The oracle's rules are our engine's modes plus shared-all (every other engine): a mode added to the
    engine without an oracle rule would make reusable_tokens follow the wrong rule."""
    from kvbench.engines.kvengine.settings.config import IsolationMode
    from kvbench.measure.conversation import Isolation

    assert {Isolation.parse(mode.value).value for mode in IsolationMode} == {mode.value for mode in IsolationMode}
    assert set(Isolation) - {Isolation.parse(mode.value) for mode in IsolationMode} == {Isolation.SHARED_ALL}
