"""What a simulated node hands back and keeps count of (sim/node.py): a restore planned, a run of decode
steps taken in one pass, and the node's counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.engines.kvengine.core.scheduler import CompactPlan
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.lower_tiers import Lookup


@dataclass(frozen=True, slots=True)
class Restore:
    """What a prompt brings back from the tiers below device before admission (None: nothing), and when
    that is done."""

    lookup: Lookup | None
    ready_at: float

    @property
    def tokens_by_tier(self) -> dict[Tier, int]:
        return self.lookup.tokens_by_tier if self.lookup is not None else {}


@dataclass(frozen=True, slots=True)
class DecodeSteps:
    """A run of decode steps a node took in one pass (`SimNode.fast_forward`): the steps carried out ended at
    `ends`, each sampling one token for every one of `request_ids`; then `plan` began at `begin`, to end
    `seconds` later like a step of `begin_step`."""

    request_ids: tuple[str, ...]
    ends: tuple[float, ...]
    plan: CompactPlan
    begin: float
    seconds: float


@dataclass(slots=True)
class NodeStats:
    steps: int = 0
    fast_forwarded: int = 0  # of the steps, those run in one pass as runs of pure decodes
    busy_s: float = 0.0
    preempted: int = 0
    restored_tokens: dict[str, int] = field(default_factory=dict)  # tier name -> tokens restored from it
    tier_hits: dict[str, int] = field(default_factory=dict)  # tier name -> requests that restored from it
    restore_s: float = 0.0
    load_wait_s: float = 0.0  # steps held up by loads in the step (LMCache's retrieve)
