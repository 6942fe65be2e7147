"""An SLO's floor at unbounded nodes: what no node count can beat, known before any simulation.

With as many nodes as requests, every request runs alone on an idle node, with the best cache it could have:

    TTFT floor     its new tokens prefilled alone, in chunks of the engine's step budget (the first token comes at
                   the end of the last chunk). New tokens: a first turn's prompt less the longest page-aligned
                   prefix any earlier request's first turn shares with it; a later turn's own user tokens (its
                   previous prompt and answer may all be cached)
    TPOT/ITL floor one decode step of it alone at its prompt's length (a longer context only costs more)
    E2E floor      TTFT floor + (output tokens - 1) x that decode step
    queue wait     0

Every request's real value is at or above its floor, so each order statistic (mean, p50, p99, max) of the real
values is at or above the same statistic of the floors: a target below that is unreachable at any node count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from kvbench.distribution import Distribution
from kvbench.sim.config import SimConfig
from kvbench.sim.cost import SeqWork
from kvbench.sim.plan import SloTarget
from kvbench.workloads.spec import Workload


def _shared_pages(prompts: Sequence[np.ndarray], page_size: int) -> list[int]:
    """For each first-turn prompt, in arrival order, the leading full pages an earlier one shares with it."""
    seen: set[int] = set()
    shared = []
    for prompt in prompts:
        parent, pages, hit = 0, [], 0
        for start in range(0, len(prompt) - page_size + 1, page_size):
            parent = hash((parent, prompt[start : start + page_size].tobytes()))
            pages.append(parent)
        while hit < len(pages) and pages[hit] in seen:
            hit += 1
        seen.update(pages)
        shared.append(hit)
    return shared


def request_floors(workload: Workload, config: SimConfig) -> dict[str, list[float]]:
    """Per request (every turn of every session), each metric's floor in ms (module docstring)."""
    cost, ps, budget = config.cost, config.preset.page_size, max(config.preset.max_step_tokens, 1)
    sessions = sorted(workload.sessions, key=lambda s: s.arrival_s)
    firsts = [np.concatenate([s.context, s.turns[0].user_tokens]) for s in sessions]
    shared = _shared_pages(firsts, ps)
    floors: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "e2e": [], "queue_wait": []}
    for session, first, hit in zip(sessions, firsts, shared):
        length = len(first)
        for k, turn in enumerate(session.turns):
            if k == 0:
                cached = min(hit * ps, length - 1)  # the last prompt token is always computed
            else:
                length += session.turns[k - 1].max_tokens + len(turn.user_tokens)
                cached = length - max(len(turn.user_tokens), 1)
            ttft = 0.0
            for start in range(cached, length, budget):
                ttft += cost.step([SeqWork(start, min(start + budget, length))]).seconds
            decode = cost.step((), (length,)).seconds
            floors["ttft"].append(ttft * 1e3)
            floors["tpot"].append(decode * 1e3)
            floors["itl"].append(decode * 1e3)
            floors["e2e"].append((ttft + (turn.max_tokens - 1) * decode) * 1e3)
            floors["queue_wait"].append(0.0)
    return floors


def slo_floors(workload: Workload, config: SimConfig, targets: Sequence[SloTarget]) -> dict[str, float]:
    """Each target's floor (SloTarget.name -> ms): its statistic over the requests' floors."""
    floors = request_floors(workload, config)
    out = {}
    for t in targets:
        distribution = Distribution.of(floors[t.metric])
        out[t.name] = float(getattr(distribution, t.stat))
    return out


def unreachable(targets: Sequence[SloTarget], floors: Mapping[str, float]) -> str | None:
    """`unreachable: floor X ms` naming the first target below its floor, or None when every one may be met."""
    for t in targets:
        if floors[t.name] > t.limit_ms:
            return f"unreachable: floor {floors[t.name]:,.0f} ms ({t.name} <= {t.limit_ms:g} ms asked)"
    return None
