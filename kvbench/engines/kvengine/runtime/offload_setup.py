"""An engine's lower KV tiers from its settings: the host, disk and remote stores they name (in whole pages, with
their TTLs) and the offload executor over them (`offload.OffloadExecutor`)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from kvbench.engines.kvengine.core.events import EventLog, PageJournal
from kvbench.engines.kvengine.core.scheduler import Scheduler
from kvbench.engines.kvengine.core.tiers import (
    Tier,
    TierConfig,
    TierPolicy,
    TierTTL,
)
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.runtime.offload import OffloadExecutor
from kvbench.engines.kvengine.runtime.tier_stores import DiskStore, HostStore, RedisStore
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.engines.kvengine.settings.tenants import TenantsConfig

log = logging.getLogger(__name__)


def executor_for(
    config: EngineConfig,
    kv_cache: PagedKVCache,
    scheduler: Scheduler,
    tenants: TenantsConfig,
    journal: PageJournal,
    events: EventLog,
    key_salt: str,
) -> OffloadExecutor:
    """The executor of an engine's settings: the lower tiers they name, in whole pages, with their TTLs."""
    ps = config.page_size
    capacities = {Tier.DEVICE: 0}  # device pages are the prefix index's; see core.tiers
    host = disk = remote = None
    secret = (config.tier_secret or "").encode()
    if config.host_capacity >= ps:
        capacities[Tier.HOST] = config.host_capacity // ps
        host = HostStore(
            capacities[Tier.HOST], kv_cache.page_bytes, pin=torch.cuda.is_available() and kv_cache.device.type == "cuda"
        )
    if config.disk_capacity >= ps:
        capacities[Tier.DISK] = config.disk_capacity // ps
        disk = DiskStore(Path(config.disk_dir), kv_cache.layout_fingerprint, secret)
    if config.remote_url:
        remote = RedisStore(config.remote_url, kv_cache.layout_fingerprint, secret)
        if not secret:
            log.warning(
                "the remote KV tier has no tier secret (--tier-secret-file or $KVENGINE_TIER_SECRET): "
                "anyone who can write to that Redis can forge pages that this engine would serve"
            )
    default_ttl = TierTTL(config.device_ttl_s, config.host_ttl_s)
    policy = TierPolicy(TierConfig(capacities, default_ttl, tenants.ttls()), events=events)
    return OffloadExecutor(
        kv_cache,
        scheduler,
        policy,
        journal,
        events,
        key_salt,
        host,
        disk,
        remote,
        maintenance_interval_s=config.tier_interval_s,
    )
