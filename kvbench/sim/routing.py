"""Routing a fleet's requests to its nodes: the policies of presets.ROUTES, each as a real deployment does it.

    session         a session's turns on one node (sticky sessions): session index mod N
    round-robin     request k to node k mod N (a Kubernetes Service)
    least-loaded    the node with the fewest requests in flight
    prefix          SGLang's cache-aware router (`sglang_router`, its defaults; see `cache_aware`)
    precise-prefix  llm-d's endpoint picker in its precise-prefix guide (see `precise_prefix`)
    prefix-affinity llm-d's endpoint picker in its optimized-baseline benchmark (see `prefix_affinity`)

llm-d's endpoint picker sums weighted scorers and takes the highest score (`max-score-picker`, which picks at
random among the nodes sharing the best score: here drawn from the run's seed, so the same seed makes the same
choices). Its scorers, with the weights of the case (`presets.Scorers`; default the precise-prefix guide's
gaie-kv-events/values.yaml, 3 / 2 / 2):

    score(node) = w_gpu * gpu_prefix + w_kv * kv_free + w_queue * queue + w_cpu * cpu_prefix
    gpu_prefix  (precise-prefix-cache-scorer) = (m - min_m) / (max_m - min_m) over the nodes holding the
                prompt's first block, where m is a node's resident leading 64-token blocks (1 for all of them
                when equal, so a lone holder gets 1); 0 on a node without the first block
    kv_free     (kv-cache-utilization-scorer) = 1 - the node's KV usage (pages held by requests / all pages)
    queue       (queue-scorer) = (max_q - q) / (max_q - min_q) over the nodes' waiting requests (1 for all
                when they are equal)
    cpu_prefix  (a second prefix-cache-scorer, the tiered-prefix-cache guide's `cpu-prefix-cache-scorer`) =
                matched leading blocks / the prompt's blocks, matched against the router's own LRU index of the
                blocks it sent to each node, `lruCapacityPerServer` blocks per node (gateway-api-inference-
                extension `plugins/multi/prefix/plugin.go`: Score = matchLen / total, PreRequest adds the
                request's hashes to the picked node). It sees what was sent, not the node's tiers: a stand-in
                for the CPU tier sized as one, as the guide sizes it (its blocks are the engine's blocks here,
                not 64 characters, and every block of the prompt counts, not the first 256)

The guide's README calls the prefix score "the fraction of the request's prefix blocks that are resident"; the
scorer's code (llm-d-inference-scheduler `precise_prefix_cache.go`: longest-prefix block counts per pod, then
`indexedScoresToNormalizedScoredPods`) normalizes the counts min-max as above, and that is what runs: a node
holding 2 of 8 blocks alone scores 1, and beside a node holding all 8 it scores 0 (the fraction: 0.25 either way).

The optimized-baseline benchmark's picker (`presets.Affinity`; llm-d-router `prefix-cache-affinity-filter` then
`token-load-scorer` and the max-score picker):

    sticky      the nodes whose router-visible prefix (matched leading blocks / the prompt's blocks, in the
                router's LRU index of the blocks it sent there, `lru_blocks` per node) is >= `threshold`
    TTFT gate   a node's estimated TTFT is its in-flight prompt tokens / `peak_prefill_tok_s`; when the best
                sticky node's exceeds the best other node's by more than `max_ttft_penalty_s`, stickiness
                breaks and every node stays a candidate; with no sticky node, every node is one
    token load  among the candidates, the fewest in-flight prompt tokens (dispatched, not finished); ties at
                random with the run's seed

"Resident" is what the node's KV events told the indexer (its device cache), plus speculative entries: with
`speculativeIndexing: true` the indexer records the prompt's blocks on the picked node at once and keeps them
for `SPECULATIVE_TTL_S`, until KV events catch up (the device cache lags routing by a prefill).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.scheduler import Request
from kvbench.sim.node import SimNode
from kvbench.sim.presets import (
    ROUTE_LEAST_LOADED,
    ROUTE_PRECISE_PREFIX,
    ROUTE_PREFIX,
    ROUTE_PREFIX_AFFINITY,
    ROUTE_ROUND_ROBIN,
    ROUTE_SESSION,
    Affinity,
    Scorers,
)

# sglang_router's cache-aware policy defaults (--cache-threshold, --balance-abs-threshold, --balance-rel-threshold)
ROUTER_CACHE_THRESHOLD, ROUTER_BALANCE_ABS, ROUTER_BALANCE_REL = 0.5, 32, 1.0001
TIE = 1e-9  # scores this close to the best are the best (sums of weighted fractions)
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
        parent = hash((parent, prompt[start : start + block_size].tobytes()))
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
    scorers: Scorers = field(default_factory=Scorers)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))  # max-score ties
    sent_blocks: list = field(default_factory=list)  # per node: the cpu_prefix index, block hash -> None, LRU first
    affinity: Affinity = field(default_factory=Affinity)
    inflight_tokens: list = field(default_factory=list)  # per node: prompt tokens routed there, not yet finished

    def __post_init__(self) -> None:
        self.routed_pages = [0] * len(self.nodes)
        self.inflight_tokens = [0] * len(self.nodes)
        self.speculative = [{} for _ in self.nodes]
        self.sent_blocks = [OrderedDict() for _ in self.nodes]

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
        elif self.policy == ROUTE_PREFIX_AFFINITY:
            node = self.prefix_affinity(request)
        else:
            assert self.policy == ROUTE_LEAST_LOADED, self.policy
            node = self.least_loaded()
        self.routed += 1
        self.routed_pages[node] += len(request.prompt) // self.page_size
        self.inflight_tokens[node] += len(request.prompt)
        return node

    def finished(self, node: int, prompt_len: int) -> None:
        self.routed_pages[node] -= prompt_len // self.page_size
        self.inflight_tokens[node] -= prompt_len

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
        w = self.scorers
        scores = [0.0] * len(self.nodes)
        if w.gpu_prefix > 0:
            resident = []  # per node: leading blocks in its cache or standing speculatively (both chains start at 0)
            for i, node in enumerate(self.nodes):
                entries = self.speculative[i]
                speculative = 0
                while speculative < len(hashes) and entries.get(hashes[speculative], -1.0) > now:
                    speculative += 1
                resident.append(max(node.cached_pages(request), speculative))
            scores = [s + w.gpu_prefix * p for s, p in zip(scores, prefix_scores(resident))]
        waiting = [node.waiting for node in self.nodes]
        low, high = min(waiting), max(waiting)
        for i, node in enumerate(self.nodes):
            queue = 1.0 if high == low else (high - waiting[i]) / (high - low)
            scores[i] += w.kv_utilization * (1.0 - node.kv_usage) + w.queue * queue
        if w.cpu_prefix > 0 and hashes:
            for i in range(len(self.nodes)):
                scores[i] += w.cpu_prefix * self._matched(i, hashes) / len(hashes)
        return scores

    def best(self, scores: Sequence[float]) -> int:
        """The highest score; among equal best scores one drawn at random (llm-d's max-score picker)."""
        top = max(scores)
        tied = [i for i, score in enumerate(scores) if score >= top - TIE]
        return tied[0] if len(tied) == 1 else int(tied[self.rng.integers(len(tied))])

    def _matched(self, node: int, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` in the router's sent-block index of `node`."""
        sent, matched = self.sent_blocks[node], 0
        while matched < len(hashes) and hashes[matched] in sent:
            matched += 1
        return matched

    def _record_sent(self, node: int, hashes: Sequence[int], capacity: int) -> None:
        sent = self.sent_blocks[node]
        for h in hashes:
            sent[h] = None
            sent.move_to_end(h)
        while len(sent) > capacity:
            sent.popitem(last=False)

    def affinity_candidates(self, hashes: Sequence[int]) -> list[int]:
        """The nodes the affinity filter keeps (module docstring): the sticky ones, unless the TTFT gate breaks
        stickiness or none is sticky (then all)."""
        a, everyone = self.affinity, list(range(len(self.nodes)))
        if not hashes:
            return everyone
        sticky = [i for i in everyone if self._matched(i, hashes) >= a.threshold * len(hashes)]
        others = [i for i in everyone if i not in sticky]
        if not sticky:
            return everyone
        if others:
            ttft = [tokens / a.peak_prefill_tok_s for tokens in self.inflight_tokens]
            if min(ttft[i] for i in sticky) - min(ttft[i] for i in others) > a.max_ttft_penalty_s:
                return everyone
        return sticky

    def prefix_affinity(self, request: Request) -> int:
        hashes = block_hashes(request.prompt, self.page_size)
        candidates = self.affinity_candidates(hashes)
        scores = [float("-inf")] * len(self.nodes)
        for i in candidates:
            scores[i] = -float(self.inflight_tokens[i])
        best = self.best(scores)
        self._record_sent(best, hashes, self.affinity.lru_blocks)
        return best

    def precise_prefix(self, request: Request, now: float) -> int:
        scores = self.precise_scores(request, now)
        best = self.best(scores)
        hashes = block_hashes(request.prompt, self.page_size)
        entries, expires = self.speculative[best], now + SPECULATIVE_TTL_S
        for h in hashes:
            entries[h] = expires
        if len(entries) > 4096 * 8:  # drop expired entries now and then: the dict stays bounded
            for h in [h for h, t in entries.items() if t <= now]:
                del entries[h]
        if self.scorers.cpu_prefix > 0:
            self._record_sent(best, hashes, self.scorers.cpu_lru_blocks)
        return best
