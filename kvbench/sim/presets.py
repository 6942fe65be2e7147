"""Policy presets: the serving systems the article compares, as settings of the one simulated engine.

Every preset runs the same core (page pool, radix prefix index with LRU eviction, scheduler); they differ
only where the systems differ in how KV is kept and found:

    vllm-prefix     vLLM automatic prefix caching: hash-chained 16-token blocks, freed blocks evicted LRU
                    (tail block first), device only, first-come-first-served admission
    sglang-radix    SGLang RadixAttention: radix tree, LRU over leaves, device only, and its default
                    cache-aware admission (longest prefix match first among waiting requests)
    lmcache-local   vLLM + LMCache with local CPU memory and local NVMe: write-through copies, lookup by
                    prefix at admission, restores pipelined NVMe -> CPU -> GPU
    lmcache-shared  vLLM + LMCache with a shared remote store (NVMe behind the network) used by several
                    nodes; requests go to the least-loaded node, so a session's next turn may land anywhere

Over several nodes (`num_nodes`, or `kvbench plan`), requests are routed as the system would be deployed:
sglang-radix behind SGLang's cache-aware router (prefix), lmcache-shared least-loaded (any node reaches
the shared tier), the others with sticky sessions (a session's turns on one node, where its KV is).
    kvengine-tiers  our engine's own tiers: the core's TierPolicy moves idle pages device -> host -> disk by
                    per-tenant TTL (exclusive tiers, one copy), restored on demand at admission

On the same core, vLLM's block LRU (free-queue order, a request's tail block first) and SGLang's leaf LRU
(deepest page of the least recent leaf first) evict the same pages; the core has one policy for both, and
the admission order is what separates the two presets here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.engines.kvengine.core.tiers import DEFAULT_TIER_INTERVAL_S, DEFAULT_TTL
from kvbench.engines.kvengine.settings.config import AUTO, DEFAULT_DECODE_STALL_FACTOR

ADMIT_FCFS = "fcfs"
ADMIT_LPM = "lpm"
# How a multi-node deployment spreads requests over its nodes (SimConfig.route, `kvbench plan --route`):
ROUTE_SESSION = "session"  # a session's turns stay on one node (sticky sessions at the load balancer)
ROUTE_LEAST_LOADED = "least-loaded"  # the node with the fewest requests in flight
ROUTE_ROUND_ROBIN = "round-robin"  # request k goes to node k mod N
ROUTE_PREFIX = "prefix"  # SGLang's cache-aware router: the node caching the longest prefix when it covers
#                          over half the prompt, else the emptiest cache; shortest queue when loads are imbalanced
ROUTE_PRECISE_PREFIX = "precise-prefix"  # llm-d's endpoint picker: weighted prefix, KV-usage and queue scorers
ROUTE_PREFIX_AFFINITY = "prefix-affinity"  # llm-d's optimized baseline: prefix-affinity filter + token-load scorer
ROUTES = (
    ROUTE_SESSION,
    ROUTE_LEAST_LOADED,
    ROUTE_ROUND_ROBIN,
    ROUTE_PREFIX,
    ROUTE_PRECISE_PREFIX,
    ROUTE_PREFIX_AFFINITY,
)
SCORERS = ("queue", "kv_utilization", "gpu_prefix", "cpu_prefix")  # llm-d's scorers a precise-prefix router sums


@dataclass(frozen=True, slots=True)
class Scorers:
    """The weights of llm-d's scorers (`routing.py`) and the CPU-prefix scorer's index size per replica, in
    blocks (its `lruCapacityPerServer`; None: no CPU-prefix index). The default is the precise-prefix guide's
    profile (prefix 3, KV utilization 2, queue 2)."""

    queue: float = 2.0
    kv_utilization: float = 2.0
    gpu_prefix: float = 3.0
    cpu_prefix: float = 0.0
    cpu_lru_blocks: int | None = None

    def __post_init__(self) -> None:
        weights = [getattr(self, name) for name in SCORERS]
        if any(w < 0 for w in weights) or not any(w > 0 for w in weights):
            raise ValueError(f"scorer weights {dict(zip(SCORERS, weights))}: give weights >= 0, at least one > 0")
        if self.cpu_prefix > 0 and (self.cpu_lru_blocks is None or self.cpu_lru_blocks < 1):
            raise ValueError("scorer cpu_prefix: give its index size in blocks per replica (cpu_lru_blocks >= 1)")


@dataclass(frozen=True, slots=True)
class Affinity:
    """llm-d's `prefix-cache-affinity-filter` (llm-d-router `prefixcacheaffinity`) and `token-load-scorer`, the
    optimized-baseline guide's profile (`routing.py`: how they pick). `threshold`: the router-visible prefix
    fraction that makes a node sticky (0.80, the guides' configs); `max_ttft_penalty_s`: how much slower the best
    sticky node's estimated TTFT (in-flight prompt tokens / `peak_prefill_tok_s`) may be than the best other
    node's before stickiness breaks (the plugin's 5000 ms); `peak_prefill_tok_s`: the plugin's default, 15928,
    calibrated for Qwen3-32B on H100 TP=2; `lru_blocks`: the prefix index's blocks per node (lruCapacityPerServer)."""

    threshold: float = 0.8
    max_ttft_penalty_s: float = 5.0
    peak_prefill_tok_s: float = 15928.0
    lru_blocks: int = 31250


TIERS_WRITE_THROUGH = "write-through"  # LMCache: copies in every lower tier, written when a request finishes
TIERS_TTL = "ttl"  # our engine: one copy, placed by the core's TierPolicy (idle time, capacity)


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    description: str
    host_fraction: float = 0.0  # share of the node's host memory given to the KV host tier (0: no tier)
    disk_fraction: float = 0.0  # share of the node's NVMe given to the KV disk tier
    remote_bytes: float = 0.0  # size of the shared remote tier (0: none)
    num_nodes: int = 1
    route: str = ROUTE_SESSION  # the real system's routing over several nodes (ROUTES); one node: unused
    admission: str = ADMIT_FCFS
    page_size: int = DEFAULT_PAGE_SIZE
    max_num_seqs: int = 256
    max_step_tokens: int = 8192
    # Prefill tokens a step computes beside running decodes (None: up to max_step_tokens); our engine's
    # max_prefill_beside_decodes, the core scheduler's rule (SchedulerConfig). 'auto': the engine's rule
    # (core.plans.stall_bounded_prefill) on the cost model's probe steps, within decode_stall_factor.
    max_prefill_beside_decodes: int | str | None = None
    decode_stall_factor: float = DEFAULT_DECODE_STALL_FACTOR
    padded_attention: bool = False  # the engine pads a step's sequences to the longest (see CostModel)
    tier_policy: str = TIERS_WRITE_THROUGH
    device_ttl_s: float = DEFAULT_TTL.device_s  # TIERS_TTL: idle seconds before a page leaves device, then host
    host_ttl_s: float = DEFAULT_TTL.host_s
    tier_interval_s: float = DEFAULT_TIER_INTERVAL_S  # TIERS_TTL: how often placement by age runs
    # Seconds a routed request spends in the router before it reaches its node (an endpoint picker's
    # tokenization and scoring); 0 for a plain load balancer. Counted in TTFT, as a client sees it.
    router_latency_s: float = 0.0
    scorers: Scorers = Scorers()  # ROUTE_PRECISE_PREFIX: the scorers' weights
    affinity: Affinity = Affinity()  # ROUTE_PREFIX_AFFINITY: the filter's parameters
    # Whose measured kernels price a step on a GPU the tables cover (kernel_data_files.BACKEND_VERSIONS:
    # vllm, sglang, trtllm); None: the roofline (our engine's own kernels were never measured there).
    kernel_backend: str | None = "vllm"

    def __post_init__(self) -> None:
        if self.admission not in (ADMIT_FCFS, ADMIT_LPM):
            raise ValueError(f"preset {self.name}: admission {self.admission!r}; use fcfs or lpm")
        if self.route not in ROUTES:
            raise ValueError(f"preset {self.name}: route {self.route!r}; use one of {', '.join(ROUTES)}")
        if self.router_latency_s < 0:
            raise ValueError(f"preset {self.name}: router_latency_s must be >= 0")
        budget = self.max_prefill_beside_decodes
        if budget is not None and budget != AUTO and (not isinstance(budget, int) or budget < 1):
            raise ValueError(
                f"preset {self.name}: max_prefill_beside_decodes {budget!r}; use a number of tokens "
                f">= 1, '{AUTO}' or none"
            )
        if self.decode_stall_factor <= 1:
            raise ValueError(f"preset {self.name}: decode_stall_factor must be > 1")
        if self.num_nodes < 1:
            raise ValueError(f"preset {self.name}: num_nodes must be >= 1")
        if self.tier_policy not in (TIERS_WRITE_THROUGH, TIERS_TTL):
            raise ValueError(f"preset {self.name}: tier_policy {self.tier_policy!r}; use write-through or ttl")
        if self.tier_policy == TIERS_TTL and self.remote_bytes > 0:
            raise ValueError(
                f"preset {self.name}: the ttl tier policy has no shared remote tier; "
                "use write-through for remote_bytes > 0"
            )


PRESETS: Mapping[str, Preset] = {
    p.name: p
    for p in (
        Preset("vllm-prefix", "vLLM prefix caching only (hash-block LRU, device only)"),
        Preset(
            "sglang-radix",
            "SGLang RadixAttention (leaf LRU, device only, longest-prefix-first admission)",
            admission=ADMIT_LPM,
            route=ROUTE_PREFIX,
            kernel_backend="sglang",
        ),
        Preset("trtllm-reuse", "TensorRT-LLM KV cache block reuse (device only)", kernel_backend="trtllm"),
        Preset(
            "lmcache-local",
            "vLLM + LMCache, local CPU + NVMe (write-through, pipelined restore)",
            host_fraction=0.5,
            disk_fraction=0.5,
        ),
        Preset(
            "lmcache-shared",
            "vLLM + LMCache, shared remote NVMe across 2 nodes (least-loaded routing)",
            remote_bytes=100e12,
            num_nodes=2,
            route=ROUTE_LEAST_LOADED,
        ),
        Preset(
            "kvengine-tiers",
            "kvbench's engine: TTL tier policy device -> host -> disk, restore on demand",
            host_fraction=0.5,
            disk_fraction=0.5,
            tier_policy=TIERS_TTL,
            max_prefill_beside_decodes=AUTO,
            kernel_backend=None,
        ),
    )
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset {name!r}: use one of {', '.join(PRESETS)}") from None
