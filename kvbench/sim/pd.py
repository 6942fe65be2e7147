"""Prefill/decode pools (`PDSpec`), as llm-d deploys vLLM with the NixlConnector: what moves between them.

    arrival     the router picks a prefill node among the prefill pool; it runs the prompt as a request for
                one token (llm-d's sidecar sends the prefill with max_tokens 1); that token is not the client's
    handoff     when the prefill finishes, its KV (the prompt's full pages) crosses the prefill node's link to
                the decode node with the fewest requests in flight (llm-d's decode active-request scorer), one
                transfer at a time per prefill node; the decode node reads it into its device cache
                (NixlConnector's load is asynchronous) and computes the rest of the prompt and the answer
    finish      the decode node's records are the client's: TTFT counts from the send to the decode node's
                first token, so it holds the prefill's queue and compute and the transfer

Nodes 0 .. prefill_replicas - 1 prefill, the rest decode (`fleet.build_nodes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvbench.engines.kvengine.core.scheduler import Request
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.hardware import Link
from kvbench.sim.kv_offload import PDSpec
from kvbench.sim.lower_tiers import Lookup
from kvbench.sim.node import Restore, SimNode
from kvbench.sim.offload_policy import LinkQueue


@dataclass(slots=True)
class Handoff:
    """The prefill pool's KV handoffs to the decode pool."""

    spec: PDSpec
    page_size: int
    kv_bytes_per_token: float
    links: list = field(default_factory=list)  # one LinkQueue per prefill node
    handed_tokens: int = 0
    transfer_s: float = 0.0

    def __post_init__(self) -> None:
        self.links = [LinkQueue() for _ in range(self.spec.prefill_replicas)]

    @property
    def link(self) -> Link:
        return Link("pd", self.spec.link_bytes_per_s, self.spec.latency_s)

    def is_prefill(self, node: int) -> bool:
        return node < self.spec.prefill_replicas

    @staticmethod
    def prefill_request(request: Request) -> Request:
        """What the prefill node is asked: the prompt, for one token."""
        return dataclasses.replace(request, max_new_tokens=1)

    def decode_node(self, nodes: Sequence[SimNode]) -> int:
        """The decode node with the fewest requests in flight (the lowest index among equals)."""
        first = self.spec.prefill_replicas
        return min(range(first, len(nodes)), key=lambda i: (nodes[i].load, i))

    def hand_off(self, prefill_node: int, request: Request, now: float) -> Restore:
        """The prompt's KV sent from `prefill_node` at `now`: what the decode node installs, and when."""
        pages = (len(request.prompt) - 1) // self.page_size  # the decode node computes the last token
        tokens = pages * self.page_size
        seconds = self.link.seconds(tokens * self.kv_bytes_per_token)
        done = self.links[prefill_node].send(now, seconds).done
        self.handed_tokens += tokens
        self.transfer_s += seconds
        lookup = Lookup({Tier.PEER: tokens}, 0, pages) if pages else None
        return Restore(lookup, done)
