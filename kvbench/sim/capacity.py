"""Capacity planning: how much KV a workload needs, how many sessions fit per tier, how long restores take.

Pure arithmetic on a ModelGeometry and a Hardware (and, for the FP8 break-even, the shipped kernel tables);
`kvbench capacity` prints it. The article's claims it
checks (see tests/sim/test_capacity.py): a dense 70B (80 layers x 8 KV heads x 128) at 128K tokens x 256
sessions needs 10 TiB of FP16 KV, not ~1 TB; MLA (DeepSeek-V3) stores ~79% less per token than that 70B.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.cost import CostModel
from kvbench.sim.fp8_break_even import BreakEven
from kvbench.sim.geometry import ModelGeometry
from kvbench.sim.hardware import Hardware
from kvbench.sim.kernel_data_files import step_kernels

TIB = 2**40
# Contexts the break-even is priced at: the kernel tables' measured decode contexts (2^k - 1), 1 to 64K; the
# crossing is linear between the two around it (`fp8_break_even.crossing`).
BREAK_EVEN_CONTEXTS = tuple(2**k - 1 for k in range(1, 17))


@dataclass(frozen=True, slots=True)
class TierCapacity:
    tier: str
    bytes: float  # KV bytes this tier can hold
    sessions: int  # whole sessions of `context` tokens that fit
    restore_s: float | None  # one session's KV back to the device; None for the device itself


@dataclass(frozen=True, slots=True)
class CapacityReport:
    model: str
    kv_dtype: str
    weight_dtype: str
    context_tokens: int
    sessions: int
    devices: int
    kv_bytes_per_token: float
    kv_bytes_per_session: float
    kv_bytes_total: float
    weight_bytes: float
    usable_bytes_per_device: float  # memory_fraction of a device, less the activation reserve
    tiers: tuple[TierCapacity, ...]
    # Where FP8 KV decodes faster than BF16 under vLLM's measured kernels (empty: no tables for this setting).
    fp8_break_even: tuple[BreakEven, ...] = ()

    @property
    def device(self) -> TierCapacity:
        return self.tiers[0]

    @property
    def fits_on_device(self) -> bool:
        return self.device.sessions >= self.sessions

    @property
    def devices_needed(self) -> int:
        """Devices of this kind that would hold the weights and every session's KV on device."""
        return max(self.devices, math.ceil((self.kv_bytes_total + self.weight_bytes) / self.usable_bytes_per_device))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["fits_on_device"] = self.fits_on_device
        out["devices_needed"] = self.devices_needed
        return out


def capacity_report(
    geometry: ModelGeometry,
    hardware: Hardware,
    kv_dtype: str,
    context_tokens: int,
    sessions: int,
    weight_dtype: str | None = None,
) -> CapacityReport:
    """KV sizes for `sessions` sessions of `context_tokens` each on `hardware` (all its devices together)."""
    if context_tokens < 1 or sessions < 1:
        raise ValueError(f"context={context_tokens}, sessions={sessions}: both must be >= 1")
    cost = CostModel(geometry, hardware, kv_dtype, weight_dtype)
    per_token = geometry.kv_bytes_per_token(kv_dtype)
    per_session = geometry.kv_bytes(kv_dtype, context_tokens)  # with the sliding layers' windows
    weights = geometry.weight_bytes(weight_dtype)
    device_bytes = max(hardware.kv_budget_bytes(weights), 0.0)

    def fit(nbytes: float) -> int:
        return int(nbytes // per_session)

    tiers = (
        TierCapacity("device", device_bytes, fit(device_bytes), None),
        TierCapacity(
            "host",
            hardware.host_memory_bytes,
            fit(hardware.host_memory_bytes),
            cost.transfer_seconds(Tier.HOST, context_tokens),
        ),
        TierCapacity(
            "disk", hardware.disk_bytes, fit(hardware.disk_bytes), cost.transfer_seconds(Tier.DISK, context_tokens)
        ),
        TierCapacity("remote", math.inf, sessions, cost.transfer_seconds(Tier.REMOTE, context_tokens)),
    )
    return CapacityReport(
        geometry.name,
        kv_dtype,
        cost.weights,
        context_tokens,
        sessions,
        hardware.num_devices,
        per_token,
        per_session,
        per_session * sessions,
        weights,
        hardware.device.memory_bytes * hardware.memory_fraction - hardware.activation_reserve_bytes,
        tiers,
        fp8_break_even(geometry, hardware),
    )


def kv_reduction(smaller: ModelGeometry, larger: ModelGeometry, kv_dtype: str = "fp16") -> float:
    """How much less KV per token `smaller` stores than `larger` (0.79 = 79% less)."""
    return 1 - smaller.kv_bytes_per_token(kv_dtype) / larger.kv_bytes_per_token(kv_dtype)


def fp8_break_even(
    geometry: ModelGeometry, hardware: Hardware, backend: str = "vllm", batches: tuple[int, ...] = (1, 32)
) -> tuple[BreakEven, ...]:
    """Where FP8 KV decode attention becomes faster than BF16 for `geometry` on `hardware` under `backend`'s
    measured kernels, one per batch size; empty where the tables do not cover them (`fp8_break_even.py`)."""
    tp, device = hardware.num_devices, hardware.device.name
    bf16, fp8 = (step_kernels(geometry, device, tp, backend, kv, None) for kv in ("bf16", "fp8"))
    if bf16 is None or fp8 is None:
        return ()
    contexts = [float(c) for c in BREAK_EVEN_CONTEXTS]
    return tuple(
        BreakEven.of(
            b,
            contexts,
            [bf16.decode_seconds(b, b * c) for c in contexts],
            [fp8.decode_seconds(b, b * c) for c in contexts],
        )
        for b in batches
    )
