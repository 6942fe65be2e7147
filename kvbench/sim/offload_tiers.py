"""The tiers below device that a `KVOffloadSpec` describes, kept as the engine's connector keeps them.

`ConnectorTiers` is a `BelowDevice` (lower_tiers.py) driven by the node at the points where vLLM calls its KV
connector (vllm/v1/core/sched/scheduler.py, distributed/kv_transfer/kv_connector/v1/):

    admission   the request reaches the head of the waiting queue: the tiers are looked up beyond the device
                hit (`get_num_new_matched_tokens`) when the node feeds it to the scheduler, not when it
                arrives: a prefix a sibling computed and stored meanwhile is found
    load        vLLM's OffloadingConnector loads asynchronously: the request waits (WAITING_FOR_REMOTE_KVS)
                while other requests' steps run, on the node's one host->device link, first come first;
                LMCache retrieves in the forward pass of the step that admits the request: the step waits
    each step   the newly computed full blocks of every prefill chunk are stored (`_get_reqs_to_store`;
                LMCache's save in the forward pass), device->host on the node's other link direction, and
                become visible to lookups when that copy is done (`complete_store`); then down to disk or the
                remote store on that tier's own link (LMCache: each backend keeps a copy)
    finish      vLLM stores the output's full blocks as well; LMCache does not (`save_decode_cache` false)
    write-back  LMCache: a hit read from disk or the remote store is kept in its cpu tier as well
    peer        after its own tiers, the node pulls from the replica whose device cache holds the longest
                prefix, when that is `min_pull_tokens` more (llm-d's P2P guide: minCachedTokenDelta 2048),
                over the network into device memory (NIXL over RDMA), asynchronously as vLLM's NixlConnector

`build_offload(config, indexes)` returns one `BelowDevice` per node (a shared remote tier is one object every
node's tiers hold). The speeds a spec states replace the hardware profile's links (`SimConfig.cost` applies
`with_tier_links`), so the cost model times every transfer on the links the case gives.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.engines.kvengine.core.namespaces import Namespace, TenantId
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.config import SimConfig
from kvbench.sim.hardware import GB, Link
from kvbench.sim.kv_offload import Connector, Medium, check_block_tokens
from kvbench.sim.lower_tiers import BelowDevice, Lookup, LowerTier
from kvbench.sim.offload_policy import LinkQueue, loadable_pages, stored_upto

TIER_OF = {Medium.CPU: Tier.HOST, Medium.DISK: Tier.DISK, Medium.REMOTE: Tier.REMOTE}


@dataclass(slots=True)
class StoreLane:
    """Where a tier's stores go: the tier, the link its copies cross after device->host (None for the host
    tier itself) and that link's queue."""

    tier: LowerTier
    link: Link | None
    queue: LinkQueue = field(default_factory=LinkQueue)


@dataclass(slots=True)
class ConnectorTiers:
    """The tiers of one node, fastest first, as vLLM's OffloadingConnector (`async_load`, `store_output`,
    `min_block`) or LMCache (none of the three) keep them. `to_host` is the device->host link (stores)."""

    lanes: tuple[StoreLane, ...]
    page_size: int
    block_pages: int
    to_host: Link
    kv_bytes_per_token: float
    async_load: bool
    store_output: bool
    min_block: bool
    restores_at_admission: bool = True
    write_back: bool = False  # a hit below the cpu tier is kept in the cpu tier too (LMCache)
    # A peer tier: the other nodes' device caches (llm-d's P2P sharing over NIXL), pulled when one holds at
    # least `min_pull_pages` more of the prompt than this node has after its own tiers.
    peers: tuple[PrefixIndex, ...] = ()
    min_pull_pages: int = 1
    to_host_queue: LinkQueue = field(default_factory=LinkQueue)
    stored_tokens: dict = field(default_factory=dict)  # tier name -> tokens written
    _stored_pages: dict = field(default_factory=dict)  # request id -> its leading pages stored
    _pending: list = field(default_factory=list)  # heap of (visible at, seq, lane, namespace, tokens, tenant)
    _seq: int = 0

    @property
    def tiers(self) -> tuple[LowerTier, ...]:
        return tuple(lane.tier for lane in self.lanes)

    # ---- admission ---------------------------------------------------------------------------------------
    def lookup(
        self, index: PrefixIndex, namespace: Namespace, prompt: np.ndarray, limit: int, now: float
    ) -> Lookup | None:
        self._land(now)
        start = have = min(index.match(namespace, prompt).num_pages, limit)
        by_tier: dict[Tier, int] = {}
        for lane in self.lanes:
            held = min(lane.tier.match_pages(namespace, prompt), limit)
            extra = loadable_pages(have, held, self.block_pages, self.min_block)
            if extra > 0:
                by_tier[lane.tier.tier] = extra * index.page_size
                lane.tier.touch(namespace, prompt[: (have + extra) * index.page_size], now)
                have += extra
        lower = sum(n for t, n in by_tier.items() if t not in (Tier.HOST, Tier.PEER))
        if self.write_back and lower and self.lanes[0].tier.tier == Tier.HOST:
            # LMCache reads a disk or remote hit into host memory objects and keeps them in its local cpu
            # backend (StorageManager.get's write-back): the next hit on it is a cpu hit. The lower tiers keep
            # no per-tenant account, so the namespace stands for the tenant.
            self.lanes[0].tier.store(namespace, prompt[: have * index.page_size], TenantId(namespace), now)
        best = max((min(peer.match(namespace, prompt).num_pages, limit) for peer in self.peers), default=0)
        if best - have >= self.min_pull_pages:
            by_tier[Tier.PEER] = (best - have) * index.page_size
            have = best
        return Lookup(by_tier, start, have) if by_tier else None

    def held_pages(self, namespace: Namespace, prompt: np.ndarray, now: float) -> int:
        """Only stores whose copy is done count: vLLM emits BlockStored (medium CPU) on `complete_store`."""
        self._land(now)
        return max((lane.tier.match_pages(namespace, prompt) for lane in self.lanes), default=0)

    def install_upto(self, lookup: Lookup, device_pages: int) -> int:
        return lookup.pages

    def installed(self, lookup: Lookup, device_pages: int) -> None:
        return None

    # ---- stores ------------------------------------------------------------------------------------------
    def computed(
        self, request_id: str, namespace: Namespace, tokens: np.ndarray, computed: int, tenant: TenantId, now: float
    ) -> None:
        """A step computed `tokens[:computed]` of a request: its new full blocks are stored."""
        if not self.lanes:
            return
        ps = self.page_size
        done = self._stored_pages.get(request_id, 0)
        upto = stored_upto(computed // ps, done, self.block_pages)
        if upto <= done:
            return
        self._stored_pages[request_id] = upto
        new_tokens = (upto - done) * ps
        nbytes = new_tokens * self.kv_bytes_per_token
        on_host = self.to_host_queue.send(now, self.to_host.seconds(nbytes)).done
        for lane in self.lanes:
            visible = on_host if lane.link is None else lane.queue.send(on_host, lane.link.seconds(nbytes)).done
            self._seq += 1
            heapq.heappush(self._pending, (visible, self._seq, lane, namespace, tokens[: upto * ps], tenant))
            name = lane.tier.tier.name.lower()
            self.stored_tokens[name] = self.stored_tokens.get(name, 0) + new_tokens

    def store(
        self,
        request_id: str,
        namespace: Namespace,
        prompt: np.ndarray,
        output: Sequence[int],
        tenant: TenantId,
        now: float,
    ) -> None:
        if self.store_output:  # every token but the last, which the engine sampled but never computed
            tokens = np.concatenate([prompt, np.asarray(output[:-1], np.int32)])
            self.computed(request_id, namespace, tokens, len(tokens), tenant, now)
        self._stored_pages.pop(request_id, None)

    def _land(self, now: float) -> None:
        """Stores whose copy is done by `now` become visible in their tier."""
        pending = self._pending
        while pending and pending[0][0] <= now:
            visible, _, lane, namespace, tokens, tenant = heapq.heappop(pending)
            lane.tier.store(namespace, tokens, tenant, visible)

    # ---- the step's fixed points (nothing: stores follow the steps' computed tokens) ---------------------
    @property
    def passive(self) -> bool:
        return True

    def maintain(self, index: PrefixIndex, now: float) -> None:
        return None

    def sync(self, now: float) -> None:
        return None


def _write_link(read: Link, gb_s: float | None, num_devices: int = 1) -> Link:
    return read if gb_s is None else Link(read.name, gb_s * GB * num_devices, read.latency_s)


def build_offload(config: SimConfig, indexes: Sequence[PrefixIndex]) -> list[BelowDevice]:
    """The tiers below each node's device cache (`indexes`: the nodes' prefix indexes, in node order)."""
    spec = config.kv_offload
    assert spec is not None
    page_size = config.preset.page_size
    check_block_tokens(spec, page_size)
    block_tokens = spec.block_tokens_for(page_size)
    block_pages = max(block_tokens // page_size, 1)
    cost, devices = config.cost, config.hardware.num_devices
    by = {t.medium: t for t in spec.tiers}
    cpu = by.get(Medium.CPU)
    to_host = _write_link(cost.link(Tier.HOST), cpu.write_gb_s if cpu else None, devices)
    shared = {
        t.medium: LowerTier.create(Tier.REMOTE, config.tier_pages(t.bytes_per_replica), page_size)
        for t in spec.tiers
        if t.medium == Medium.REMOTE
    }
    native = spec.connector == Connector.VLLM_NATIVE
    min_pull_pages = -(-spec.min_pull_tokens // page_size)
    belows: list[BelowDevice] = []
    for i, _ in enumerate(indexes):
        lanes = []
        for t in spec.tiers:
            if t.medium not in TIER_OF:
                continue
            tier = shared.get(t.medium) or LowerTier.create(
                TIER_OF[t.medium], config.tier_pages(t.bytes_per_replica), page_size
            )
            link = None if t.medium == Medium.CPU else _write_link(cost.link(tier.tier), t.write_gb_s)
            lanes.append(StoreLane(tier, link))
        peers = tuple(x for j, x in enumerate(indexes) if j != i) if Medium.PEER in by else ()
        belows.append(
            ConnectorTiers(
                tuple(lanes),
                page_size,
                block_pages,
                to_host,
                cost.kv_bytes_per_token,
                async_load=native or bool(peers),
                store_output=native,
                min_block=native,
                write_back=not native,
                peers=peers,
                min_pull_pages=min_pull_pages,
            )
        )
    return belows
