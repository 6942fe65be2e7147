"""Tier policy with an explicit clock, tenant victim selection, and trace statistics."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.engines.kvengine.core.events import EventKind, EventLog
from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.tenants import EvictionStep, TenantLedger, TenantTerms
from kvbench.engines.kvengine.core.tiers import Move, MoveKind, Tier, TierConfig, TierPolicy, TierTTL
from kvbench.engines.kvengine.core.trace_replay import replay_prefix_hits

A, B, P = TenantId("a"), TenantId("b"), TenantId("premium")


def test_ttl_demotion_pressure_and_restore_plan():
    events = EventLog()
    cfg = TierConfig({Tier.DEVICE: 2, Tier.HOST: 2, Tier.DISK: 10}, tenant_ttls={B: TierTTL(5.0, 60.0)})
    pol = TierPolicy(cfg, events)
    pol.track("a1", A, now=0.0)
    pol.track("b1", B, now=0.0)
    assert pol.plan(now=4.0) == ()  # everything younger than 5 s
    # t=10: b1 is past b's 5 s device TTL; a1 (default 30 s) stays.
    assert pol.plan(now=10.0) == (Move("b1", MoveKind.DEMOTE, Tier.DEVICE, Tier.HOST),)
    for m in pol.plan(now=10.0):
        pol.apply(m, now=10.0)
    # t=700: both past their host TTL (600 s default, 60 s for b): straight to disk.
    moves = pol.plan(now=700.0)
    assert {(m.key, m.dst) for m in moves} == {("a1", Tier.DISK), ("b1", Tier.DISK)}
    for m in moves:
        pol.apply(m, now=700.0)
    # Pressure: 3 fresh device pages for 2 device slots: the oldest goes down to host.
    for i, t in enumerate((701.0, 702.0, 703.0)):
        pol.track(f"n{i}", A, now=t)
    assert pol.plan(now=704.0) == (Move("n0", MoveKind.DEMOTE, Tier.DEVICE, Tier.HOST),)
    for m in pol.plan(now=704.0):
        pol.apply(m, now=704.0)
    # Restore a prefix [a1 (disk), n0 (host), n1 (device), unknown, n2]: stops at the unknown key; disk
    # pages go to host first, then every host page goes to device.
    plan = pol.restore_plan(["a1", "n0", "n1", "gone", "n2"])
    assert plan.keys == ("a1", "n0", "n1")
    assert plan.stages == ((Tier.DISK, Tier.HOST, ("a1",)), (Tier.HOST, Tier.DEVICE, ("a1", "n0")))
    moved = [(e.kind, e.tenant, e.tier) for e in events.take_events()]
    assert moved[0] == (EventKind.MOVED, "b", "host") and len(moved) == 4
    with pytest.raises(ValueError, match="plan again"):
        pol.apply(Move("n0", MoveKind.DEMOTE, Tier.DEVICE, Tier.HOST), now=705.0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["track", "touch", "forget", "plan", "apply_some"]),
            st.integers(0, 11),
            st.sampled_from([Tier.DEVICE, Tier.HOST, Tier.DISK]),
            st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0]),
            st.integers(0, 3),
        ),
        max_size=60,
    ),
    st.sampled_from(
        [
            {Tier.DEVICE: 0, Tier.HOST: 3, Tier.DISK: 5},
            {Tier.DEVICE: 2, Tier.HOST: 2, Tier.DISK: 4},
            {Tier.DEVICE: 0, Tier.DISK: 4},
        ]
    ),
)
def test_plan_quick_answer_agrees_with_the_full_pass(ops, capacities):
    """`plan` answers "nothing to do" from its bookkeeping when it can; that answer must always be the full
    pass's. Random tracks, touches, forgets and partly applied plans, on a clock that only moves forward in
    steps that land on the TTL boundaries."""
    cfg = TierConfig(capacities, TierTTL(5.0, 20.0), {B: TierTTL(2.0, 8.0)})
    pol = TierPolicy(cfg)
    now = 0.0
    for op, k, tier, dt, n in ops:
        now += dt
        key, tenant = f"k{k}", (A, B)[k % 2]
        if tier not in capacities:
            tier = Tier.DISK
        if op == "track":
            pol.track(key, tenant, now - dt / 2, tier)
        elif op == "touch" and pol.tier_of(key) is not None:
            pol.touch(key, now)
        elif op == "forget":
            pol.forget(key)
        quick = pol.plan(now)
        full = pol._full_plan(now)  # the reference: every entry visited
        assert quick == full
        if op == "apply_some":
            for move in full[:n]:
                pol.apply(move, now)
        assert pol.usage() == {t: sum(1 for key in pol.keys() if pol.tier_of(key) == t) for t in cfg.tiers}


def test_ledger_victim_order_quota_cap_and_reservation():
    ledger = TenantLedger(100, {A: TenantTerms(30), B: TenantTerms(60), P: TenantTerms(40, reserved_device_pages=20)})
    usage = {A: 45, B: 25, P: 30}
    evictable = {A: 40, B: 20, P: 30}
    steps = ledger.eviction_plan(B, need=20, usage=usage, evictable=evictable)
    # a is 15 over quota: those go first; then LRU among plain tenants; premium only above its 20 reserved.
    assert steps == (
        EvictionStep(frozenset({A}), 15),
        EvictionStep(frozenset({A, B}), 20),
        EvictionStep(frozenset({P}), 10),
    )
    # Under contention a tenant at the cap must first give up its own pages.
    steps = ledger.eviction_plan(A, need=10, usage={A: 50, B: 50}, evictable={A: 50, B: 50})
    assert steps[0] == EvictionStep(frozenset({A}), 20) and steps[1] == EvictionStep(frozenset({A}), 10, enforce=True)
    assert not ledger.may_hold(A, 51, contended=True) and ledger.may_hold(A, 51, contended=False)
    with pytest.raises(ValueError, match="cap_fraction"):
        TenantLedger(10, cap_fraction=0.0)


def _brute_force_unbounded(prompts, ps):
    seen, hits = set(), 0
    for p in prompts:
        keys = [p[: (i + 1) * ps].tobytes() for i in range(len(p) // ps)]
        hits += ps * next((i for i, k in enumerate(keys) if k not in seen), len(keys))
        seen.update(keys)
    return hits / sum(len(p) for p in prompts)


def test_replay_matches_brute_force_and_lru_is_bounded():
    rng = np.random.default_rng(0)
    bases = [rng.integers(0, 50, 200, dtype=np.int32) for _ in range(5)]
    prompts = [
        np.concatenate(
            [bases[rng.integers(5)][: rng.integers(10, 200)], rng.integers(0, 50, rng.integers(0, 40), dtype=np.int32)]
        )
        for _ in range(60)
    ]
    stats = replay_prefix_hits(prompts, page_size=16, capacities_tokens=(64, 100_000))
    assert stats.requests == 60 and stats.prompt_tokens == sum(len(p) for p in prompts)
    assert stats.unbounded_token_hit_rate == pytest.approx(_brute_force_unbounded(prompts, 16))
    assert stats.lru_token_hit_rate[100_000] == stats.unbounded_token_hit_rate  # never evicts
    assert stats.lru_token_hit_rate[64] < stats.unbounded_token_hit_rate
    assert set(stats.to_json()) == {"requests", "prompt_tokens", "unbounded_token_hit_rate", "lru_token_hit_rate"}
    with pytest.raises(ValueError, match="prompts"):
        replay_prefix_hits([np.zeros((2, 2), np.int32)])


from tests.paths import MOONCAKE  # noqa: E402


def test_mooncake_head_matches_block_level_count():
    """First 300 rows: the page-level unbounded rate equals the block-level count of the hash ids when
    only full 16-token pages of a short last block can hit."""
    rows = [json.loads(line) for _, line in zip(range(300), MOONCAKE.open())]
    blocks = {}

    def block(h):
        if h not in blocks:
            blocks[h] = np.random.default_rng(h).integers(0, 32000, 512, dtype=np.int32)
        return blocks[h]

    prompts = [np.concatenate([block(h) for h in r["hash_ids"]])[: r["input_length"]] for r in rows]
    expected, seen = 0, {}  # chain of hash ids -> longest length of its last block sent
    for r in rows:  # block-level: a block is a hit if its chain was seen as a full or partial block before
        ids, n = r["hash_ids"], r["input_length"]
        for i in range(len(ids)):
            size = min(512, n - 512 * i)
            seen_len = seen.get(tuple(ids[: i + 1]), 0)
            expected += (min(size, seen_len) // 16) * 16
            if min(size, seen_len) < size:
                break
        for i in range(len(ids)):
            key = tuple(ids[: i + 1])
            seen[key] = max(seen.get(key, 0), min(512, n - 512 * i))
    stats = replay_prefix_hits(prompts)
    assert stats.unbounded_token_hit_rate == pytest.approx(expected / sum(r["input_length"] for r in rows))
