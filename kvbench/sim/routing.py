"""Routing a fleet's requests to its nodes: the policies of presets.ROUTES, each as a real deployment does it.

    session         a session's turns on one node (sticky sessions): session index mod N
    round-robin     request k to node k mod N (a Kubernetes Service)
    least-loaded    the node with the fewest requests in flight
    prefix          SGLang's cache-aware router (`sglang_router`, its defaults; see `cache_aware`)
    precise-prefix  llm-d's endpoint picker in its precise-prefix guide (see `precise_prefix`)

llm-d's precise-prefix profile (guides/precise-prefix-cache-aware/gaie-kv-events/values.yaml) sums weighted
scorers and takes the highest score (`max-score-picker`; ties: the lowest node index here):

    score(node) = 3.0 * prefix + 2.0 * kv_free + 2.0 * queue
    prefix   = (m - min_m) / (max_m - min_m) over the nodes holding the prompt's first block, where m is a
               node's resident leading 64-token blocks (1 for all of them when equal, so a lone holder gets 1);
               0 on a node without the first block
    kv_free  = 1 - the node's KV usage (pages held by requests / all pages)
    queue    = (max_q - q) / (max_q - min_q) over the nodes' waiting requests (1 for all when they are equal)

The guide's README calls the prefix score "the fraction of the request's prefix blocks that are resident"; the
scorer's code (llm-d-inference-scheduler `precise_prefix_cache.go`: longest-prefix block counts per pod, then
`indexedScoresToNormalizedScoredPods`) normalizes the counts min-max as above, and that is what runs: a node
holding 2 of 8 blocks alone scores 1, and beside a node holding all 8 it scores 0 (the fraction: 0.25 either way).

"Resident" is what the node's KV events told the indexer (its device cache), plus speculative entries: with
`speculativeIndexing: true` the indexer records the prompt's blocks on the picked node at once and keeps them
for `SPECULATIVE_TTL_S`, until KV events catch up (the device cache lags routing by a prefill).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.scheduler import Request
from kvbench.sim.node import SimNode
from kvbench.sim.presets import (
    ROUTE_LEAST_LOADED,
    ROUTE_PRECISE_PREFIX,
    ROUTE_PREFIX,
    ROUTE_ROUND_ROBIN,
    ROUTE_SESSION,
)

# sglang_router's cache-aware policy defaults (--cache-threshold, --balance-abs-threshold, --balance-rel-threshold)
ROUTER_CACHE_THRESHOLD, ROUTER_BALANCE_ABS, ROUTER_BALANCE_REL = 0.5, 32, 1.0001
# llm-d's precise-prefix scheduling profile: scorer weights as the guide configures them.
PRECISE_PREFIX_WEIGHT, KV_UTILIZATION_WEIGHT, QUEUE_WEIGHT = 3.0, 2.0, 2.0
SPECULATIVE_TTL_S = 2.0  # how long a speculative index entry stands in for the KV events (an assumption)


def prefix_scores(resident: Sequence[int]) -> list[float]:
    """llm-d's prefix score per node from its resident leading blocks (module docstring): min-max over the nodes
    holding at least the first block, 1 for all of them when their counts are equal, 0 for the others."""
    held = [m for m in resident if m > 0]
    if not held:
        return [0.0] * len(resident)
    low, high = min(held), max(held)
    return [0.0 if m == 0 else 1.0 if high == low else (m - low) / (high - low) for m in resident]


def block_hashes(prompt: np.ndarray, block_size: int) -> list[int]:
    """Chained hashes of the prompt's full blocks: block i's hash covers blocks 0..i, as vLLM's block hashes."""
    hashes, parent = [], 0
    for start in range(0, len(prompt) - block_size + 1, block_size):
        parent = hash((parent, prompt[start:start + block_size].tobytes()))
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class Router:
    """Picks the node for each request (`pick`) and hears when one finishes (`finished`)."""

    nodes: list[SimNode]
    policy: str
    page_size: int
    routed: int = 0  # requests routed so far (round-robin)
    routed_pages: list = field(default_factory=list)  # per node: prompt pages routed there, not yet finished
    speculative: list = field(default_factory=list)  # per node: block hash -> when the entry expires

    def __post_init__(self) -> None:
        self.routed_pages = [0] * len(self.nodes)
        self.speculative = [{} for _ in self.nodes]

    def pick(self, session_index: int, request: Request, now: float) -> int:
        """The node for `request`, by the policy (module docstring)."""
        nodes = self.nodes
        if len(nodes) == 1:
            node = 0
        elif self.policy == ROUTE_SESSION:
            node = session_index % len(nodes)
        elif self.policy == ROUTE_ROUND_ROBIN:
            node = self.routed % len(nodes)
        elif self.policy == ROUTE_PREFIX:
            node = self.cache_aware(request)
        elif self.policy == ROUTE_PRECISE_PREFIX:
            node = self.precise_prefix(request, now)
        else:
            assert self.policy == ROUTE_LEAST_LOADED, self.policy
            node = self.least_loaded()
        self.routed += 1
        self.routed_pages[node] += len(request.prompt) // self.page_size
        return node

    def finished(self, node: int, prompt_len: int) -> None:
        self.routed_pages[node] -= prompt_len // self.page_size

    def least_loaded(self) -> int:
        return min(range(len(self.nodes)), key=lambda i: (self.nodes[i].load, i))

    def cache_aware(self, request: Request) -> int:
        """SGLang's cache-aware router (`sglang_router.launch_router`, its defaults): shortest queue while the
        loads are imbalanced (max - min > 32 and max > 1.0001 x min); otherwise the node with the longest
        cached prefix if it covers more than half the prompt, else the node with the least cached (most room).
        The router keeps an approximate tree of what it sent; here each node's device cache is asked."""
        nodes = self.nodes
        loads = [node.load for node in nodes]
        if max(loads) - min(loads) > ROUTER_BALANCE_ABS and max(loads) > ROUTER_BALANCE_REL * min(loads):
            return self.least_loaded()
        cached = [node.cached_pages(request) for node in nodes]
        best = min(range(len(nodes)), key=lambda i: (-cached[i], loads[i], i))
        if cached[best] * self.page_size > ROUTER_CACHE_THRESHOLD * len(request.prompt):
            return best
        # The router's tree holds what it sent, computed yet or not: a node's cache plus its in-flight prompts.
        # (The device cache alone lags routing, and a burst of new sessions all went to one node.)
        tree = [node.scheduler.index.cached_pages + self.routed_pages[i] for i, node in enumerate(nodes)]
        return min(range(len(nodes)), key=lambda i: (tree[i], loads[i], i))

    def precise_scores(self, request: Request, now: float) -> list[float]:
        """Each node's llm-d score (module docstring) for `request` at `now`."""
        hashes = block_hashes(request.prompt, self.page_size)
        resident = []  # per node: leading blocks in its cache or standing speculatively (both chains start at 0)
        for i, node in enumerate(self.nodes):
            entries = self.speculative[i]
            speculative = 0
            while speculative < len(hashes) and entries.get(hashes[speculative], -1.0) > now:
                speculative += 1
            resident.append(max(node.cached_pages(request), speculative))
        waiting = [node.waiting for node in self.nodes]
        low, high = min(waiting), max(waiting)
        scores = []
        for i, (node, prefix) in enumerate(zip(self.nodes, prefix_scores(resident))):
            queue = 1.0 if high == low else (high - waiting[i]) / (high - low)
            scores.append(PRECISE_PREFIX_WEIGHT * prefix + KV_UTILIZATION_WEIGHT * (1.0 - node.kv_usage)
                          + QUEUE_WEIGHT * queue)
        return scores

    def precise_prefix(self, request: Request, now: float) -> int:
        scores = self.precise_scores(request, now)
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        entries, expires = self.speculative[best], now + SPECULATIVE_TTL_S
        for h in block_hashes(request.prompt, self.page_size):
            entries[h] = expires
        if len(entries) > 4096 * 8:  # drop expired entries now and then: the dict stays bounded
            for h in [h for h, t in entries.items() if t <= now]:
                del entries[h]
        return best
