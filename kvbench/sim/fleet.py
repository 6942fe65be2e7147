"""The simulated fleet's nodes, built from a SimConfig: each node's pool, prefix index, scheduler and the tiers
below its device (the preset's, or a `KVOffloadSpec`'s as its connector keeps them, `offload_tiers.py`)."""

from __future__ import annotations

import dataclasses

from kvbench.engines.kvengine.core.events import EventSink, NullEventLog
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.plans import probe_shape, stall_bounded_prefill
from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.scheduler import Scheduler, SchedulerConfig
from kvbench.engines.kvengine.core.tiers import Tier, TierTTL
from kvbench.sim.config import MEMORY_VLLM, SimConfig
from kvbench.sim.cost import SeqWork
from kvbench.sim.hybrid_cache import StaleSliding
from kvbench.sim.lower_tiers import LowerTier, WriteThroughTiers
from kvbench.sim.node import SimNode
from kvbench.sim.offload_tiers import build_offload
from kvbench.sim.presets import AUTO, TIERS_TTL
from kvbench.sim.ttl_tiers import TtlTiers


def prefill_beside_decodes(config: SimConfig, device_pages: int) -> int | None:
    """The preset's max_prefill_beside_decodes; 'auto' resolved as our engine resolves it, by the core's rule on
    the probe's steps, here costed by the cost model instead of timed."""
    preset = config.preset
    if preset.max_prefill_beside_decodes != AUTO:
        return preset.max_prefill_beside_decodes
    shape = probe_shape(preset.max_step_tokens, device_pages * preset.page_size)
    decode = SeqWork(shape.context, shape.context + 1)

    def step_s(n: int) -> float:  # the engine's median chunk: the second of its prompt
        return config.cost.step([decode, SeqWork(n, 2 * n)] if n else [decode]).seconds

    return stall_bounded_prefill(step_s, shape, preset.decode_stall_factor)


def _ledger(config: SimConfig, pages: int):
    return config.tenants.ledger(pages) if config.tenants.tenants else None


def build_nodes(config: SimConfig, events: EventSink | None = None) -> list[SimNode]:
    """The fleet's nodes in order; with a prefill/decode split (`config.pd`), the prefill pool first (with the
    case's KV tiers) and then the decode pool (device only, NIXL's handoffs its only source), each pool of its
    own devices per replica. Under vLLM's memory arithmetic a hybrid model's nodes keep its stale
    sliding-window pages cached, as vLLM's hybrid allocator does (`hybrid_cache.py`)."""
    nodes = _nodes(config, events)
    if config.memory_model == MEMORY_VLLM:
        for node in nodes:
            node.stale = StaleSliding.of(config.geometry, config.preset.page_size)
    return nodes


def _nodes(config: SimConfig, events: EventSink | None = None) -> list[SimNode]:
    pd = config.pd
    if pd is None:
        return _pool(config, events)
    hw = config.hardware

    def pool(count: int, devices: int | None, kv_offload, **preset_changes) -> SimConfig:
        return dataclasses.replace(
            config,
            hardware=hw if devices is None else hw.with_devices(devices),
            pd=None,
            kv_offload=kv_offload,
            preset=dataclasses.replace(config.preset, num_nodes=count, **preset_changes),
        )

    prefill = _pool(pool(pd.prefill_replicas, pd.prefill_devices, config.kv_offload), events)
    decode = _pool(
        pool(pd.decode_replicas, pd.decode_devices, None, host_fraction=0.0, disk_fraction=0.0, remote_bytes=0.0),
        events,
    )
    for i, node in enumerate(decode):
        node.node_id = pd.prefill_replicas + i
    return prefill + decode


def _pool(config: SimConfig, events: EventSink | None = None) -> list[SimNode]:
    preset = config.preset
    remote = None
    if preset.remote_bytes > 0:  # one object: every node shares it
        remote = LowerTier.create(Tier.REMOTE, config.tier_pages(preset.remote_bytes), preset.page_size)
    host_pages, disk_pages, device_pages = config.host_pages(), config.disk_pages(), config.device_pages()
    sched_config = SchedulerConfig(
        max_num_seqs=preset.max_num_seqs,
        max_step_tokens=preset.max_step_tokens,
        max_prefill_beside_decodes=prefill_beside_decodes(config, device_pages),
        strict_isolation=config.strict_isolation,
    )
    ttl = TierTTL(preset.device_ttl_s, preset.host_ttl_s)
    sink = events if events is not None else NullEventLog()
    if config.kv_offload is not None:  # the tiers the case states, as its connector keeps them
        indexes = [
            PrefixIndex(PagePool(1 + device_pages, preset.page_size), events=sink) for _ in range(preset.num_nodes)
        ]
        return [
            SimNode(
                i,
                Scheduler(index, sched_config, ledger=_ledger(config, index.pool.capacity)),
                config.cost,
                below,
                preset.admission,
                config.decode_runs,
            )
            for i, (index, below) in enumerate(zip(indexes, build_offload(config, indexes)))
        ]
    nodes = []
    for i in range(preset.num_nodes):
        pool = PagePool(1 + device_pages, preset.page_size)
        ledger = _ledger(config, pool.capacity)
        if preset.tier_policy == TIERS_TTL and (host_pages > 0 or disk_pages > 0):
            below = TtlTiers.create(host_pages, disk_pages, ttl, config.tenants.ttls(), preset.tier_interval_s, sink)
            index = PrefixIndex(pool, events=sink, journal=below.journal, key_salt=below.key_salt)
        else:
            tiers = []
            if host_pages > 0:
                tiers.append(LowerTier.create(Tier.HOST, host_pages, preset.page_size))
            if disk_pages > 0:
                tiers.append(LowerTier.create(Tier.DISK, disk_pages, preset.page_size))
            if remote is not None:
                tiers.append(remote)
            below = WriteThroughTiers(tuple(tiers))
            index = PrefixIndex(pool, events=sink)
        nodes.append(
            SimNode(
                i,
                Scheduler(index, sched_config, ledger=ledger),
                config.cost,
                below,
                preset.admission,
                config.decode_runs,
            )
        )
    return nodes
