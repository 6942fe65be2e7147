"""What a workload asks for before it is run: sizes, token counts and the prefix reuse an unbounded cache gets.

Answers are unknown before a run, so each turn's answer is a deterministic placeholder of `max_tokens` ids
(unique per session and turn), and requests are observed in the order of their earliest send time (arrival
plus think times, service time ignored). Each tenant is its own oracle namespace. The real run's
`oracle_hit_rate` uses the real answers and send order, so it differs slightly from this estimate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvbench.distribution import Distribution
from kvbench.workloads.oracle import PrefixOracle
from kvbench.workloads.spec import TOKEN_DTYPE, Session, Workload
from kvbench.workloads.tokens import keyed_tokens, safe_token_range, stable_key


@dataclass(frozen=True)
class TenantStats:
    """One tenant's share of a workload and its oracle hit rate (reusable / prompt tokens)."""

    tenant: str
    tier: str
    sessions: int
    requests: int
    prompt_tokens_total: int
    reusable_tokens_total: int
    oracle_hit_rate: float | None


@dataclass(frozen=True)
class WorkloadStats:
    """Sizes of a workload with placeholder answers; `to_dict()` for JSON and the CLI."""

    name: str
    sessions: int
    requests: int
    tenants: int
    prompt_tokens: Distribution | None
    output_tokens: Distribution | None
    prompt_tokens_total: int
    reusable_tokens_total: int
    oracle_hit_rate: float | None
    duration_s: float
    per_tenant: tuple[TenantStats, ...]

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PlannedRequest:
    """A request as the stats see it: its earliest send time and its prompt with placeholder answers."""

    send_s: float
    session: Session
    turn: int
    prompt: np.ndarray


def workload_stats(workload: Workload, *, oracle_block_tokens: int = 64) -> WorkloadStats:
    """Sizes and the unbounded-cache hit rate of `workload`, overall and per tenant (see the module doc)."""
    oracle = PrefixOracle(oracle_block_tokens)
    prompt_lengths, output_lengths = [], []
    prompt_by_tenant: dict[str, int] = {}
    reusable_by_tenant: dict[str, int] = {}
    requests_by_tenant: dict[str, int] = {}
    last_send = 0.0
    for request in planned_requests(workload):
        tenant = request.session.tenant
        reusable = oracle.observe(tenant, request.prompt)
        prompt_lengths.append(len(request.prompt))
        output_lengths.append(request.session.turns[request.turn].max_tokens)
        prompt_by_tenant[tenant] = prompt_by_tenant.get(tenant, 0) + len(request.prompt)
        reusable_by_tenant[tenant] = reusable_by_tenant.get(tenant, 0) + reusable
        requests_by_tenant[tenant] = requests_by_tenant.get(tenant, 0) + 1
        last_send = max(last_send, request.send_s)
    tiers = {t.name: t.tier for t in workload.tenants}
    per_tenant = tuple(
        TenantStats(
            tenant,
            tiers.get(tenant, "basic"),
            sum(s.tenant == tenant for s in workload.sessions),
            requests_by_tenant[tenant],
            prompt_by_tenant[tenant],
            reusable_by_tenant[tenant],
            _rate(reusable_by_tenant[tenant], prompt_by_tenant[tenant]),
        )
        for tenant in sorted(prompt_by_tenant)
    )
    prompt_total, reusable_total = sum(prompt_by_tenant.values()), sum(reusable_by_tenant.values())
    return WorkloadStats(
        workload.name,
        len(workload.sessions),
        len(prompt_lengths),
        len(per_tenant),
        Distribution.of(prompt_lengths),
        Distribution.of(output_lengths),
        prompt_total,
        reusable_total,
        _rate(reusable_total, prompt_total),
        last_send,
        per_tenant,
    )


def planned_requests(workload: Workload) -> Iterator[PlannedRequest]:
    """Every turn with its placeholder-answer prompt, in order of earliest send time (ties: session order)."""
    order = []
    for index, session in enumerate(workload.sessions):
        send_s = session.arrival_s
        for turn_index, turn in enumerate(session.turns):
            send_s += turn.think_time_s
            order.append((send_s, index, turn_index))
    order.sort()
    token_range = safe_token_range(workload.vocab_size)
    # The prompt so far of each session with a turn still to come; dropped after its last turn.
    prompts: dict[int, np.ndarray] = {}
    for send_s, index, turn_index in order:
        session = workload.sessions[index]
        turn = session.turns[turn_index]
        if turn_index == 0:
            prompt = _concat(session.context, turn.user_tokens)
        else:
            previous = session.turns[turn_index - 1]
            answer = keyed_tokens(
                stable_key("placeholder-answer", session.session_id, turn_index - 1), previous.max_tokens, token_range
            )
            prompt = _concat(prompts.pop(index), answer, turn.user_tokens)
        if turn_index + 1 < len(session.turns):
            prompts[index] = prompt
        yield PlannedRequest(send_s, session, turn_index, prompt)


def _concat(*parts: np.ndarray) -> np.ndarray:
    non_empty = [p for p in parts if len(p)]
    if len(non_empty) == 1:
        return non_empty[0]  # a trace request's whole prompt: no copy
    return np.concatenate(non_empty).astype(TOKEN_DTYPE, copy=False) if non_empty else np.zeros(0, TOKEN_DTYPE)


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None
