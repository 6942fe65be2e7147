"""The tiers below device that a `KVOffloadSpec` describes, built for each simulated node.

`build_offload(config, indexes)` returns one `BelowDevice` per node (a shared remote tier is one object every
node's tiers hold). The speeds a spec states replace the hardware profile's links (`SimConfig.cost` applies
`with_tier_links`), so the cost model times every restore on the links the case gives.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.engines.kvengine.core.prefix_index import PrefixIndex
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.config import SimConfig
from kvbench.sim.kv_offload import Medium
from kvbench.sim.lower_tiers import BelowDevice, LowerTier, WriteThroughTiers

TIER_OF = {Medium.CPU: Tier.HOST, Medium.DISK: Tier.DISK, Medium.REMOTE: Tier.REMOTE}


def build_offload(config: SimConfig, indexes: Sequence[PrefixIndex]) -> list[BelowDevice]:
    """The tiers below each node's device cache (`indexes`: the nodes' prefix indexes, in node order)."""
    spec = config.kv_offload
    assert spec is not None
    page_size = config.preset.page_size
    shared = {t.medium: LowerTier.create(Tier.REMOTE, config.tier_pages(t.bytes_per_replica), page_size)
              for t in spec.tiers if t.medium == Medium.REMOTE}
    belows: list[BelowDevice] = []
    for _ in indexes:
        tiers = []
        for t in spec.tiers:
            if t.medium in shared:
                tiers.append(shared[t.medium])
            elif t.medium in TIER_OF:
                tiers.append(LowerTier.create(TIER_OF[t.medium], config.tier_pages(t.bytes_per_replica), page_size))
        belows.append(WriteThroughTiers(tuple(tiers)))
    return belows
