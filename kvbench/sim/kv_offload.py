"""What a case or a user says about KV below the device: an offload tier and a prefill/decode split, parsed once.

The spellings (a case file's `engine.kv_offload` and `pd`):

    kv_offload: {medium: cpu, connector: vllm-native, bytes_per_replica: 100.0e+9}
    kv_offload:                                   # several tiers, fastest first, one connector (LMCache)
      - {medium: cpu, connector: lmcache, bytes_per_replica: 20.0e+9}
      - {medium: disk, connector: lmcache, bytes_per_replica: 1.2e+12, read_gb_s: 2.0, latency_ms: 1.0}
    pd: {prefill_replicas: 8, decode_replicas: 2, link_gbps: 400, decode_devices: 4}

`medium`: cpu (host memory), disk (a local drive, or a file system such as Lustre mounted as one), remote (a
store shared by every replica), peer (other replicas' caches, pulled over the network: llm-d's P2P sharing).
`connector` is how the engine drives the tier, each as its source does it (sim/offload_tiers.py):

    vllm-native  vLLM's OffloadingConnector (vllm/distributed/kv_transfer/kv_connector/v1/offloading/
                 scheduler.py): every step's newly computed full blocks of `block_tokens` are stored
                 (`_get_reqs_to_store`, GPU -> CPU, asynchronous); at admission the blocks beyond the GPU hit
                 are looked up and loaded asynchronously (`get_num_new_matched_tokens` returns load_async:
                 the request waits while other requests' steps run). Its offloaded block defaults to the GPU
                 block (`kv_connector_extra_config.block_size`, a multiple of the GPU block).
    lmcache      LMCache: chunks of `block_tokens` (its `chunk_size`, 256 by default) saved as the forward
                 pass computes them, looked up by prefix at admission and retrieved before the request's step.

Bandwidths (`read_gb_s`, `write_gb_s`) are in gigabytes per second and latencies per transfer; absent, they
are the hardware profile's links (cpu: host<->device per device, disk: the profile's disk, remote and peer:
its network), so a case states only what its source measured. `pd.link_gbps` is a network's gigabits per second
(NIXL over a 400 Gb/s NIC: 400), as network links are quoted.

`parse_kv_offload` and `parse_pd` are the one door for these mappings: a bad value is a `TierSpecError` (the
settings error the CLI prints as one line) naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from kvbench.settings import SettingsError, bounded, build
from kvbench.sim.hardware import GB, Hardware, Link

LMCACHE_CHUNK_TOKENS = 256  # LMCache's default chunk_size (lmcache/v1/config.py)
PEER_MIN_PULL_TOKENS = 2048  # llm-d's P2P guide: pull only when the peer holds this many more tokens


class TierSpecError(SettingsError):
    """A KV tier or P/D mapping that cannot be used; the message names the field and the fix."""


class Medium(str, Enum):
    CPU = "cpu"
    DISK = "disk"
    REMOTE = "remote"
    PEER = "peer"


class Connector(str, Enum):
    VLLM_NATIVE = "vllm-native"
    LMCACHE = "lmcache"


@dataclass(frozen=True, slots=True)
class OffloadTier:
    """One tier below the device: its medium, its size per replica (a shared remote: its whole size) and, where
    given, the speeds that replace the hardware profile's link for it (None: the profile's)."""

    medium: Medium
    bytes_per_replica: float | None  # None for a peer tier: the peers' own caches
    read_gb_s: float | None = None
    write_gb_s: float | None = None
    latency_s: float | None = None


@dataclass(frozen=True, slots=True)
class KVOffloadSpec:
    """The tiers below the device, fastest first, as one connector drives them. `block_tokens` is the unit
    stored and loaded (None: the connector's default, `block_tokens_for`)."""

    connector: Connector
    tiers: tuple[OffloadTier, ...]
    block_tokens: int | None = None
    min_pull_tokens: int = PEER_MIN_PULL_TOKENS  # a peer tier: the least extra tokens worth a pull

    @property
    def medium(self) -> Medium:
        """The fastest tier's medium (the issue's one-tier spelling)."""
        return self.tiers[0].medium

    @property
    def bytes_per_replica(self) -> float | None:
        return self.tiers[0].bytes_per_replica

    def block_tokens_for(self, gpu_block_tokens: int) -> int:
        """The unit of a store and a load: the given block, else vLLM's GPU block or LMCache's chunk."""
        if self.block_tokens is not None:
            return self.block_tokens
        return gpu_block_tokens if self.connector == Connector.VLLM_NATIVE else LMCACHE_CHUNK_TOKENS


@dataclass(frozen=True, slots=True)
class PDSpec:
    """Prefill/decode pools: prompts are prefilled on one of `prefill_replicas`, their KV sent at `link_gbps`
    (gigabits per second, after `latency_s`) to one of `decode_replicas`, which decodes. Devices per replica of
    each pool: None for the case's own."""

    prefill_replicas: int
    decode_replicas: int
    link_gbps: float
    latency_s: float = 0.0
    prefill_devices: int | None = None
    decode_devices: int | None = None

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


@dataclass(frozen=True)
class _TierDoc:
    """A tier mapping as written (the settings checker's view); `parse_kv_offload` turns it into values."""

    medium: str | None = None
    connector: str | None = None
    bytes_per_replica: float | None = bounded(None, gt=0, unit="bytes")
    block_tokens: int | None = bounded(None, ge=1, unit="tokens")
    read_gb_s: float | None = bounded(None, gt=0, unit="GB/s")
    write_gb_s: float | None = bounded(None, gt=0, unit="GB/s")
    latency_ms: float | None = bounded(None, ge=0, unit="ms")
    min_pull_tokens: int | None = bounded(None, ge=1, unit="tokens")


@dataclass(frozen=True)
class _PDDoc:
    prefill_replicas: int | None = bounded(None, ge=1)
    decode_replicas: int | None = bounded(None, ge=1)
    link_gbps: float | None = bounded(None, gt=0, unit="Gb/s")
    latency_ms: float = bounded(0.0, ge=0, unit="ms")
    prefill_devices: int | None = bounded(None, ge=1)
    decode_devices: int | None = bounded(None, ge=1)


def _choice(kind: type[Enum], value: str | None, where: str) -> Enum:
    names = ", ".join(m.value for m in kind)
    if value is None:
        raise TierSpecError(f"{where} is missing; give one of {names}")
    try:
        return kind(value)
    except ValueError:
        raise TierSpecError(f"{where} is {value!r}; use one of {names}") from None


def _document(cls: type, values: object, where: str):
    try:
        return build(cls, values, where)
    except TierSpecError:
        raise
    except SettingsError as error:
        raise TierSpecError(str(error)) from None


def parse_kv_offload(mapping: Mapping | Sequence, field: str = "engine.kv_offload") -> KVOffloadSpec:
    """The tier(s) `mapping` describes: one tier mapping, or a list of them fastest first (one connector)."""
    docs = list(mapping) if isinstance(mapping, (list, tuple)) else [mapping]
    if not docs:
        raise TierSpecError(
            f"{field} is an empty list; give at least one tier, e.g. {{medium: cpu, "
            "connector: vllm-native, bytes_per_replica: 100.0e+9}"
        )
    tiers, connectors = [], []
    block_tokens = min_pull = None
    for i, raw in enumerate(docs):
        where = f"{field}[{i}]" if len(docs) > 1 else field
        doc = _document(_TierDoc, raw, where)
        medium = _choice(Medium, doc.medium, f"{where}.medium")
        connectors.append(_choice(Connector, doc.connector, f"{where}.connector"))
        if medium != Medium.PEER and doc.bytes_per_replica is None:
            raise TierSpecError(
                f"{where}.bytes_per_replica is missing; give the tier's size in bytes per replica, e.g. 100.0e+9"
            )
        if medium == Medium.PEER and doc.bytes_per_replica is not None:
            raise TierSpecError(
                f"{where}.bytes_per_replica: a peer tier is the other replicas' own caches; leave it out"
            )
        if doc.min_pull_tokens is not None and medium != Medium.PEER:
            raise TierSpecError(f"{where}.min_pull_tokens applies to a peer tier only; leave it out")
        if medium == Medium.CPU and i > 0:
            raise TierSpecError(f"{where}.medium is cpu; a cpu tier is the fastest below the device, list it first")
        block_tokens = doc.block_tokens if doc.block_tokens is not None else block_tokens
        min_pull = doc.min_pull_tokens if doc.min_pull_tokens is not None else min_pull
        latency = None if doc.latency_ms is None else doc.latency_ms / 1e3
        tiers.append(OffloadTier(medium, doc.bytes_per_replica, doc.read_gb_s, doc.write_gb_s, latency))
    if len(set(connectors)) > 1:
        raise TierSpecError(
            f"{field}: the tiers name connectors {', '.join(c.value for c in connectors)}; one "
            "engine drives all its tiers through one connector, give the same one to each"
        )
    if len({t.medium for t in tiers}) < len(tiers):
        raise TierSpecError(f"{field}: a medium is listed twice; give each tier once")
    spec = KVOffloadSpec(
        connectors[0], tuple(tiers), block_tokens, min_pull if min_pull is not None else PEER_MIN_PULL_TOKENS
    )
    if spec.connector == Connector.VLLM_NATIVE and any(t.medium in (Medium.DISK, Medium.REMOTE) for t in tiers):
        raise TierSpecError(
            f"{field}: vllm-native offloads to cpu (its CPUOffloadingSpec); use connector: lmcache "
            "for a disk or remote tier"
        )
    return spec


def parse_pd(mapping: Mapping, field: str = "pd") -> PDSpec:
    """The prefill/decode split `mapping` describes."""
    doc = _document(_PDDoc, mapping, field)
    for key, example in (("prefill_replicas", "8"), ("decode_replicas", "2"), ("link_gbps", "400 (a 400 Gb/s NIC)")):
        if getattr(doc, key) is None:
            raise TierSpecError(f"{field}.{key} is missing; give it, e.g. {key}: {example}")
    return PDSpec(
        doc.prefill_replicas,
        doc.decode_replicas,
        doc.link_gbps,
        doc.latency_ms / 1e3,
        doc.prefill_devices,
        doc.decode_devices,
    )


def check_block_tokens(spec: KVOffloadSpec, gpu_block_tokens: int, field: str = "engine.kv_offload") -> None:
    """vLLM stores whole GPU blocks: its offloaded block must be a multiple of the GPU block."""
    unit = spec.block_tokens_for(gpu_block_tokens)
    if spec.connector == Connector.VLLM_NATIVE and unit % gpu_block_tokens:
        raise TierSpecError(
            f"{field}.block_tokens is {unit}; vLLM offloads whole GPU blocks, give a multiple of "
            f"the block size {gpu_block_tokens}"
        )


def _link(link: Link, tier: OffloadTier) -> Link:
    bandwidth = link.bandwidth if tier.read_gb_s is None else tier.read_gb_s * GB
    latency = link.latency_s if tier.latency_s is None else tier.latency_s
    return dataclasses.replace(link, bandwidth=bandwidth, latency_s=latency)


def with_tier_links(hardware: Hardware, spec: KVOffloadSpec) -> Hardware:
    """`hardware` with the links the spec's tiers state: cpu the host<->device link (per device), disk the
    disk, remote and peer the network."""
    by = {t.medium: t for t in spec.tiers}
    if (
        Medium.REMOTE in by
        and Medium.PEER in by
        and (by[Medium.REMOTE].read_gb_s, by[Medium.REMOTE].latency_s)
        != (by[Medium.PEER].read_gb_s, by[Medium.PEER].latency_s)
    ):
        raise TierSpecError(
            "engine.kv_offload: remote and peer tiers share the node's network link; give them "
            "the same read_gb_s and latency_ms"
        )
    changes = {}
    if Medium.CPU in by:
        changes["host_link"] = _link(hardware.host_link, by[Medium.CPU])
    if Medium.DISK in by:
        changes["disk"] = _link(hardware.disk, by[Medium.DISK])
    for medium in (Medium.REMOTE, Medium.PEER):
        if medium in by:
            changes["network"] = _link(hardware.network, by[medium])
    return dataclasses.replace(hardware, **changes)
