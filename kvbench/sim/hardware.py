"""Hardware profiles as data: accelerators, the links between KV tiers, and a calibration hook.

A `Hardware` is one serving node: `num_devices` accelerators running one tensor-parallel engine, the host
memory and NVMe behind them, and a network link to a shared (remote) KV tier. Datasheet peaks are kept as
published; what the simulator actually uses is peak * efficiency, and the efficiencies are what calibration
fits (see `calibrate`).

Sources of the defaults (H200 and H100 SXM datasheets; the article for PCIe and NVMe):
    H200        141 GB HBM3e at 4.8 TB/s, dense BF16 ~989 TFLOP/s, dense FP8 ~1979 TFLOP/s, NVLink 900 GB/s
    H100        80 GB HBM3 at 3.35 TB/s, dense BF16 ~989 TFLOP/s, dense FP8 ~1979 TFLOP/s, NVLink 900 GB/s;
                memory as the driver reports it (79.2 GiB: vLLM's total_memory), not the marketing 80e9
    PCIe host   ~40 GB/s per device (the article's number; Gen5 x16 is 64 GB/s raw)
    NVMe        ~12 GB/s (one Gen5 drive, the article's number)
    network     25 GB/s (a 200 Gb/s NIC) to the shared tier
Efficiencies: 0.5 of peak FLOP/s and 0.8 of peak bandwidth are typical of large-batch serving kernels, and
for the H200 they are assumptions (`Hardware.fitted_on` is None; simulate and plan say so in their output): the
device machine measured bf16 matmuls at ~790 TFLOP/s (0.8 of peak), but whole prefill steps (attention,
norms, all-reduce) land nearer 0.5. `sim/calibrate.py` fits them (and the per-step overhead) to measured
steps of a real engine; `kvbench calibrate` does so for our engine on this machine and saves a profile.
On H100 and H200 the efficiencies only price what the measured kernel tables do not cover (sim/kernel_cost.py:
MLA models, presets without a kernel backend, `Device.kernel_tables` false); there a step costs what its
kernels measured, plus `step_overhead_s`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

GB = 1e9


class HardwareError(ValueError):
    """A hardware name or profile file that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    memory_bytes: float
    memory_bw: float  # bytes/s
    flops_bf16: float  # dense FLOP/s
    flops_fp8: float
    flops_efficiency: float = 0.5
    bw_efficiency: float = 0.8
    interconnect_bw: float = 900 * GB  # per device, for tensor-parallel all-reduce
    interconnect_latency_s: float = 8e-6  # per all-reduce
    # Whether a step's compute and memory traffic overlap (GPU kernels: step = the larger of the two) or
    # follow one another (eager PyTorch on a CPU: step = their sum).
    overlap: bool = True
    # Price steps from measured kernel tables where they cover this device, the engine and the model
    # (sim/kernel_cost.py; the efficiencies above then move nothing); False: the roofline everywhere.
    kernel_tables: bool = True

    def flops(self, weight_dtype: str) -> float:
        """Effective FLOP/s for matmuls whose weights are `weight_dtype` (fp8 weights run fp8 matmuls)."""
        peak = self.flops_fp8 if weight_dtype.startswith("fp8") else self.flops_bf16
        return peak * self.flops_efficiency

    @property
    def effective_bw(self) -> float:
        return self.memory_bw * self.bw_efficiency


@dataclass(frozen=True, slots=True)
class Link:
    """A transfer path: `bandwidth` bytes/s after a fixed `latency_s` per transfer."""

    name: str
    bandwidth: float
    latency_s: float = 0.0

    def seconds(self, num_bytes: float) -> float:
        return 0.0 if num_bytes <= 0 else self.latency_s + num_bytes / self.bandwidth


@dataclass(frozen=True, slots=True)
class Hardware:
    """One node: `num_devices` x `device` in one tensor-parallel group, plus the KV tiers' links and sizes.

    `host_link` is per device (devices copy their own KV shard in parallel); `disk` and `network` are per
    node. `memory_fraction` of device memory is the engine's (vLLM's gpu_memory_utilization); of that,
    weights come first and `activation_reserve_bytes` per device is kept for activations and graphs.
    """

    name: str
    device: Device
    num_devices: int
    host_link: Link
    disk: Link
    network: Link
    host_memory_bytes: float
    disk_bytes: float
    memory_fraction: float = 0.9
    activation_reserve_bytes: float = 6 * GB
    step_overhead_s: float = 0.002  # scheduler + launch per engine step (CPU side), not overlapped
    # What the efficiencies and step overhead were fitted to (`kvbench calibrate`); None: assumed values,
    # never fitted on this device (see `assumptions`).
    fitted_on: str | None = None

    def __post_init__(self) -> None:
        if self.num_devices < 1:
            raise HardwareError(f"{self.name}: num_devices must be >= 1")
        if not 0 < self.memory_fraction <= 1:
            raise HardwareError(f"{self.name}: memory_fraction must be in (0, 1], e.g. 0.9")

    def assumptions(self, pricing: str = "roofline") -> str:
        """One line for a simulation's output: what priced its steps (`CostModel.pricing`: "roofline" or
        "measured ... kernels on ...") and whether the speeds it used are fitted or assumed."""
        d = self.device
        overhead = f"step overhead {self.step_overhead_s * 1e3:.1f} ms"
        if pricing != "roofline":  # the efficiencies move nothing: each step costs its kernels + the overhead
            speeds = f"steps priced by {pricing} (aiconfigurator-core's tables) plus a {overhead}"
        else:
            speeds = (
                f"steps priced by the roofline: {d.name} efficiencies FLOP/s {d.flops_efficiency:.2f} of peak, "
                f"bandwidth {d.bw_efficiency:.2f} of peak, {overhead}"
            )
        if self.fitted_on is not None:
            return f"{speeds}, fitted to {self.fitted_on}"
        return (
            f"assumption: {speeds}; these are typical values, not fitted on a {d.name} (every simulated time "
            f"scales with them); fit them to a GPU run's step log with `kvbench calibrate --steps "
            f"RUN/engines/kvengine/steps.jsonl --hardware {self.name} --compute-dtype bfloat16`"
        )

    def with_devices(self, num_devices: int) -> Hardware:
        return dataclasses.replace(self, name=f"{num_devices}x{self.device.name}", num_devices=num_devices)

    @property
    def host_bw(self) -> float:
        """Aggregate host <-> device bandwidth (each device moves its own shard)."""
        return self.host_link.bandwidth * self.num_devices

    def kv_budget_bytes(self, weight_bytes: float) -> float:
        """Device bytes left for KV after weights and activations; negative when the weights do not fit."""
        usable = self.device.memory_bytes * self.memory_fraction - self.activation_reserve_bytes
        return usable * self.num_devices - weight_bytes


H200 = Device("h200", memory_bytes=141 * GB, memory_bw=4.8e12, flops_bf16=989e12, flops_fp8=1979e12)
H100 = Device("h100", memory_bytes=79.19 * 2**30, memory_bw=3.35e12, flops_bf16=989e12, flops_fp8=1979e12)
PCIE = Link("pcie", bandwidth=40 * GB, latency_s=20e-6)
NVME = Link("nvme", bandwidth=12 * GB, latency_s=100e-6)
NETWORK = Link("network", bandwidth=25 * GB, latency_s=50e-6)

# An 8xH200 node: 2 TB of host memory and 30 TB of NVMe are typical of such servers.
_H200_NODE = Hardware("8xh200", H200, 8, PCIE, NVME, NETWORK, host_memory_bytes=2000 * GB, disk_bytes=30000 * GB)
_H100_NODE = Hardware("8xh100", H100, 8, PCIE, NVME, NETWORK, host_memory_bytes=2000 * GB, disk_bytes=30000 * GB)

# This machine's CPU running our engine in fp32: peaks are 2 cores x 32 FLOP/cycle (two 8-wide FMA units) x
# ~3 GHz and a guessed 20 GB/s. The efficiencies are those `kvbench calibrate --steps` fitted to our engine
# serving SmolLM2-135M here (results/sim/validation/cpu-calibrated.json; the fitted step overhead was 0).
CPU = Device(
    "cpu",
    memory_bytes=24 * GB,
    memory_bw=20 * GB,
    flops_bf16=192e9,
    flops_fp8=192e9,
    flops_efficiency=0.86,
    bw_efficiency=0.30,
    interconnect_bw=10 * GB,
    interconnect_latency_s=0.0,
    overlap=False,
)
_CPU_NODE = Hardware(
    "cpu",
    CPU,
    1,
    Link("memcpy", 10 * GB),
    Link("disk", 1 * GB, 1e-4),
    Link("redis", 1 * GB, 1e-4),
    host_memory_bytes=8 * GB,
    disk_bytes=50 * GB,
    memory_fraction=0.5,
    activation_reserve_bytes=1 * GB,
    step_overhead_s=0.0,
    fitted_on="our engine's steps serving SmolLM2-135M on kvbench's development CPU (kvbench calibrate)",
)

PROFILES: Mapping[str, Hardware] = {
    "h200": _H200_NODE.with_devices(1),
    "8xh200": _H200_NODE,
    "h100": _H100_NODE.with_devices(1),
    "8xh100": _H100_NODE,
    "cpu": _CPU_NODE,
}


def load_hardware(name_or_path: str) -> Hardware:
    """A profile by name (`8xh200`, `h200`, `h100`, `cpu`, or `NxPROFILE`, e.g. `2xh100`) or a JSON file written by `save_hardware`."""
    key = name_or_path.lower()
    if key in PROFILES:
        return PROFILES[key]
    count, sep, base = key.partition("x")
    if sep and count.isdigit() and base in PROFILES:
        return PROFILES[base].with_devices(int(count))
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise HardwareError(f"hardware {name_or_path!r}: not valid JSON ({error})") from None
        if isinstance(data, dict) and "fitted_on" not in data:  # written before profiles said what they were fitted to
            data["fitted_on"] = f"the profile {path.name}"
        return hardware_from_dict(data)
    raise HardwareError(
        f"hardware {name_or_path!r}: use one of {', '.join(PROFILES)}, NxPROFILE (e.g. 4xh200) or a profile .json"
    )


def hardware_to_dict(hardware: Hardware) -> dict:
    return dataclasses.asdict(hardware)


def hardware_from_dict(data: Mapping) -> Hardware:
    try:
        fields = dict(data)
        fields["device"] = Device(**fields["device"])
        for key in ("host_link", "disk", "network"):
            fields[key] = Link(**fields[key])
        return Hardware(**fields)
    except (KeyError, TypeError) as error:
        raise HardwareError(f"hardware profile: {error}; write it with kvbench.sim.hardware.save_hardware") from None


def save_hardware(hardware: Hardware, path: Path) -> None:
    path.write_text(json.dumps(hardware_to_dict(hardware), indent=2))
