"""What a simulation simulates: the model, the hardware, the preset and how the KV budget is found."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.engines.kvengine.settings.tenants import TenantsConfig
from kvbench.measure.conversation import Isolation
from kvbench.sim.cost import CostModel
from kvbench.sim.geometry import ModelGeometry
from kvbench.sim.hardware import Hardware
from kvbench.sim.kernel_data_files import step_kernels
from kvbench.sim.kv_offload import KVOffloadSpec, PDSpec, with_tier_links
from kvbench.sim.presets import Preset
from kvbench.sim.vllm_memory import VllmMemory, vllm_memory

MEMORY_RESERVE = "reserve"
MEMORY_VLLM = "vllm"
MEMORY_MODELS = (MEMORY_RESERVE, MEMORY_VLLM)
# What a simulation holds in this process, measured (tracemalloc and peak RSS, qwen2.5-72b on 8xh200): every
# node's page pool takes 48 bytes per device page up front (its free list and reference counts; the lower
# tiers allocate as they fill), and a rag-chat session about 94 KiB (its turns' tokens, records, tree pages).
SIM_BASE_BYTES = 256 << 20  # the interpreter, numpy, the libraries
SIM_NODE_BYTES = 64 << 10
SIM_DEVICE_PAGE_BYTES = 48
SIM_SESSION_BYTES = 128 << 10


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What is simulated. `device_kv_tokens` overrides the KV budget derived from the hardware (tests, sweeps)."""

    geometry: ModelGeometry
    hardware: Hardware
    preset: Preset
    kv_dtype: str = "fp16"
    weight_dtype: str | None = None
    device_kv_tokens: int | None = None
    strict_isolation: bool = True
    tenants: TenantsConfig = TenantsConfig()  # quotas and reservations: each node's scheduler gets their ledger
    host_kv_tokens: int | None = None  # override the host tier (default: the preset's share of host memory)
    disk_kv_tokens: int | None = None  # ... and the disk tier
    # Run stretches of pure decode steps between events in one pass (SimNode.fast_forward); False: step one by
    # one. The records are the same either way: a switch for checking that, not a setting of what is simulated.
    decode_runs: bool = True
    # How the device KV budget is found: MEMORY_RESERVE (the hardware's memory_fraction less a fixed activation
    # reserve) or MEMORY_VLLM (vLLM's profiled arithmetic at the preset's batch limits, `sim/vllm_memory.py`).
    memory_model: str = MEMORY_RESERVE
    # The KV tiers below device as an engine's connector keeps them (`sim/offload_tiers.py`); None: the preset's
    # own (host/disk fractions, remote bytes, tier policy). A prefill/decode split of the replicas (None: none).
    kv_offload: KVOffloadSpec | None = None
    pd: PDSpec | None = None

    def __post_init__(self) -> None:
        if self.memory_model not in MEMORY_MODELS:
            raise ValueError(f"memory model {self.memory_model!r}: use one of {', '.join(MEMORY_MODELS)}")

    def vllm_memory(self) -> VllmMemory:
        hw, preset = self.hardware, self.preset
        return vllm_memory(
            self.geometry,
            hw.device.memory_bytes,
            hw.num_devices,
            hw.memory_fraction,
            preset.page_size,
            preset.max_step_tokens,
            preset.max_num_seqs,
            self.kv_dtype,
            self.weight_dtype,
        )

    @property
    def cost(self) -> CostModel:
        hw = self.hardware if self.kv_offload is None else with_tier_links(self.hardware, self.kv_offload)
        backend = self.preset.kernel_backend if hw.device.kernel_tables else None
        kernels = step_kernels(self.geometry, hw.device.name, hw.num_devices, backend, self.kv_dtype, self.weight_dtype)
        return CostModel(
            self.geometry,
            hw,
            self.kv_dtype,
            self.weight_dtype,
            self.preset.padded_attention,
            self.preset.page_size,
            kernels,
        )

    @property
    def isolation(self) -> Isolation:
        """The oracle's rule: our engine's isolation (its core is what the nodes run)."""
        return Isolation.STRICT if self.strict_isolation else Isolation.SHARED_PREFIX

    def device_pages(self) -> int:
        """Device KV pages per node: the hardware's KV budget (or the override) over the page's bytes; with the
        vLLM memory model, the blocks vLLM's own arithmetic gives (`vllm_memory`)."""
        ps = self.preset.page_size
        if self.device_kv_tokens is not None:
            return self.device_kv_tokens // ps
        if self.memory_model == MEMORY_VLLM:
            memory = self.vllm_memory()
            memory.check_fits(self.geometry.name, self.hardware.num_devices)
            return memory.kv_tokens // ps
        cost = self.cost
        weights = self.geometry.weight_bytes(self.weight_dtype)
        budget = self.hardware.kv_budget_bytes(weights)
        pages = int(budget // (cost.kv_bytes_per_token * ps)) if budget > 0 else 0
        if pages < 2:
            hw = self.hardware
            raise ValueError(
                f"{self.geometry.name} weights ({weights / 1e9:.1f} GB) do not fit on {hw.name} with "
                f"room for KV ({hw.kv_budget_bytes(0) / 1e9:.1f} GB usable): use more devices or fp8 "
                "weights"
            )
        return pages

    def memory_bytes(self, sessions: int) -> int:
        """An estimate of the memory simulating `sessions` sessions on this fleet takes (`SIM_*_BYTES`)."""
        nodes = self.preset.num_nodes
        return (
            SIM_BASE_BYTES
            + nodes * (SIM_NODE_BYTES + SIM_DEVICE_PAGE_BYTES * self.device_pages())
            + sessions * SIM_SESSION_BYTES
        )

    def check_memory(self, sessions: int, available_bytes: int) -> None:
        """ValueError naming the estimate when simulating `sessions` sessions needs more than `available_bytes`
        (`kvbench simulate --nodes 100000` was accepted, took 15.5 GB and met the kernel's OOM killer)."""
        need = self.memory_bytes(sessions)
        if need > available_bytes:
            raise ValueError(
                f"simulate: {self.preset.num_nodes:,} nodes x {self.device_pages():,} device pages and {sessions:,} "
                f"sessions need about {need / 2**30:,.1f} GiB of memory; this machine has {available_bytes / 2**30:,.1f} "
                "GiB available: use fewer --nodes, a smaller --device-kv-tokens or fewer --num-sessions"
            )

    def tier_pages(self, nbytes: float) -> int:
        return int(nbytes // (self.cost.kv_bytes_per_token * self.preset.page_size))

    def host_pages(self) -> int:
        if self.host_kv_tokens is not None:
            return self.host_kv_tokens // self.preset.page_size
        return self.tier_pages(self.hardware.host_memory_bytes * self.preset.host_fraction)

    def disk_pages(self) -> int:
        if self.disk_kv_tokens is not None:
            return self.disk_kv_tokens // self.preset.page_size
        return self.tier_pages(self.hardware.disk_bytes * self.preset.disk_fraction)
