"""Hypothesis state machines: random operation sequences keep every invariant of pool, index and ledger."""

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvbench.engines.kvengine.core.namespaces import TenantId, namespace_for
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.tenants import TenantLedger, TenantTerms, evict_for

PS = 4
TENANTS = [TenantId("a"), TenantId("b"), TenantId("premium")]
prompts = st.lists(st.integers(0, 3), min_size=1, max_size=6).map(
    lambda pages: np.repeat(np.array(pages, dtype=np.int32), PS)
)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = PagePool(17, PS)
        self.index = PrefixIndex(self.pool)
        self.ledger = TenantLedger(
            16,
            {
                TENANTS[0]: TenantTerms(6),
                TENANTS[1]: TenantTerms(6),
                TENANTS[2]: TenantTerms(8, reserved_device_pages=4),
            },
        )
        self.held = []  # (match, own pages) of "running requests"
        self.now = 0.0
        self.inserted = {t: [] for t in TENANTS}  # prompts each tenant inserted

    @rule(tenant=st.sampled_from(TENANTS), tokens=prompts)
    def admit_and_cache(self, tenant, tokens):
        self.now += 1
        ns = namespace_for(tenant, shareable=False, strict=True)
        m = self.index.match(ns, tokens)
        # Strict isolation: whatever matched must be a prefix this same tenant inserted.
        if m.num_pages:
            assert any(np.array_equal(p[: m.num_tokens], tokens[: m.num_tokens]) for p in self.inserted[tenant])
        self.index.lock(m, self.now)
        need = len(tokens) // PS - m.num_pages
        usage = self.index.pages_by_tenant()
        before = {t: usage.get(t, 0) for t in TENANTS}
        if not self.pool.can_allocate(need):
            taken = evict_for(self.index, self.ledger, tenant, need - self.pool.num_free, usage, self.now)
            # Premium's reservation: others never take it below its reserved pages.
            if tenant != TENANTS[2] and taken.get(TENANTS[2]):
                assert before[TENANTS[2]] - taken[TENANTS[2]] >= 4
        if not self.pool.can_allocate(need):
            self.index.unlock(m)
            return
        pages = self.pool.allocate(need)
        self.index.insert(ns, tokens, list(m.pages) + pages, tenant, self.now)
        self.inserted[tenant].append(tokens)
        self.held.append((m, pages))

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def finish(self, i):
        m, pages = self.held.pop(i % len(self.held))
        self.pool.release(pages)
        self.index.unlock(m)

    @rule(n=st.integers(0, 8))
    def evict(self, n):
        self.now += 1
        before = self.index.evictable_pages
        res = self.index.evict(n, self.now)
        assert res.num_pages == min(n, before)

    @invariant()
    def integrity(self):
        self.pool.check_integrity()
        self.index.check_integrity()
        cached = self.index.cached_page_ids()
        free = set(self.pool._free)
        assert not free & set(cached), "a page is both free and cached"
        for _, pages in self.held:
            assert not free & set(pages), "a page is both free and held by a request"
        assert self.index.protected_pages <= sum(len(m.pages) + 8 for m, _ in self.held) or not self.held


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
