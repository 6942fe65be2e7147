"""`lmcache`: vLLM with LMCache, KV offloaded to CPU RAM, local disk or a Redis store.

Two ways to connect them (`connector`):
- `mp` (default; the only one that runs on vLLM's CPU build): LMCache's multiprocess cache server
  (`python -m lmcache.v1.multiprocess.http_server`, launched by this adapter in `lmcache-server/`) beside vLLM
  with `--kv-transfer-config '{"kv_connector":"LMCacheMPConnector",...}'`. Its DRAM is the CPU tier
  (max_local_cpu_size GB), `local_disk_path` an fs L2 tier, a `redis://` remote_url a resp L2 tier: see
  lmcache_mp.py. Its counters (`lmcache_mp_*`) are scraped with vLLM's.
- `v1`: LMCache inside vLLM's worker (`LMCacheConnectorV1`), configured by a YAML file written to the adapter's
  folder and passed through LMCACHE_CONFIG_FILE; CUDA only (on CPU LMCache 0.5.6 finds no device connector
  and caches nothing). Its `lmcache:*` counters appear in vLLM's /metrics only with a shared
  PROMETHEUS_MULTIPROC_DIR, which the adapter sets in its folder.

LMCache reads every `LMCACHE_<KEY>` variable over its config (lmcache/v1/config_base.py,
`update_config_from_env`), so the children get the driver's environment without any inherited `LMCACHE_*`
variable. The reset drops the connector's cache too (`/reset_prefix_cache?reset_external=true`, retried like
vLLM's; with `mp` that clears the server's DRAM), then empties the disk folder's chunk files (`mp`) and deletes
this model's chunks from a Redis store (`flush_remote: false` keeps them): a reset that left a tier warm would
hand the next cold-cache probe a hit.

Written against LMCache 0.5.6: its config keys (`REFERENCE_KEYS`), its MP server's --help
(lmcache_mp.REFERENCE_HELP) and vLLM's flags (vllm.py).

Presets (the article's rows): `local-cpu-nvme` (CPU RAM, then a local NVMe folder) and `distributed-shared`
(CPU RAM, then a remote store that several vLLM servers share; `remote_url` is required). Explicit keys override
the preset's values.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

import yaml

from kvbench.engines.base import EngineError
from kvbench.engines.http import request
from kvbench.engines.launch import LaunchedAdapter, LaunchedServer, LaunchPlan, free_port, installed_version
from kvbench.engines.lmcache_mp import (
    CLEAR_PATH,
    DISK_FILE_SUFFIX,
    HEALTH_PATH,
    SERVER_ENV,
    SERVER_MODULE,
    STATUS_PATH,
    MPServerPlan,
    kv_transfer_config,
    stores_in_flight,
)
from kvbench.engines.vllm import (
    DISTRIBUTIONS,  # noqa: F401 - PYTHON_ENV: preflight names it
    KV_VOCABULARY,
    REFERENCE_HELP,
    VLLM_CAPABILITIES,
    VLLMSettings,
    reset_prefix_cache,
    resolve_model,
    settings_values,
    vllm_description,
    vllm_plan,
    vllm_python,
)
from kvbench.settings import SettingsError, build

WRITTEN_AGAINST = "LMCache 0.5.6 (config keys, MP server --help); vLLM flags as the vllm adapter"
REFERENCE_KEYS = {"lmcache 0.5.6": "lmcache-0.5.6-config-keys.txt"}  # tests/data/shared/reference/
ENV_PREFIX = "LMCACHE_"
REDIS_SCHEMES = ("redis", "rediss")
CONNECTORS = ("mp", "v1")
CONFIG_FILE = "lmcache.yaml"
PROMETHEUS_DIR = "prometheus-multiproc"
CACHE_SERVER_DIR = "lmcache-server"  # the MP cache server's log and help text, beside vLLM's
DISK_DIR = "lmcache-disk"
CACHE_SERVER_START_S = 120.0  # the MP server imports torch and LMCache: ~10 s on 2 busy cores
V1_TRANSFER_CONFIG = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}, separators=(",", ":"))

PRESETS: Mapping[str, Mapping[str, object]] = MappingProxyType(
    {
        "local-cpu-nvme": {"local_cpu": True, "max_local_cpu_size": 100.0, "max_local_disk_size": 1000.0},
        "distributed-shared": {"local_cpu": True, "max_local_cpu_size": 100.0, "remote_serde": "naive"},
    }
)


@dataclass(frozen=True)
class LMCacheSettings:
    """LMCache's own keys (YAML names), plus `connector`, `preset` and `local_disk_path`: a folder for the disk
    tier (default: `lmcache-disk` in the adapter's folder when the preset or max_local_disk_size asks for one).
    With `connector: mp` the CPU tier is required, remote_url must be redis://, the disk tier has no size cap
    (LMCache's fs L2 tier keeps none) and remote_serde does not apply. Every other setting of engine.lmcache is
    a vLLM setting (see VLLMSettings)."""

    connector: str = "mp"
    preset: str | None = None
    chunk_size: int = 256
    local_cpu: bool = True
    max_local_cpu_size: float = 5.0
    local_disk_path: str | None = None
    max_local_disk_size: float = 0.0
    remote_url: str | None = None
    remote_serde: str = "naive"
    flush_remote: bool = True  # on reset, delete this model's chunks from a Redis remote store

    def __post_init__(self) -> None:
        if self.connector not in CONNECTORS:
            raise ValueError(f"connector {self.connector!r} is not one of {', '.join(CONNECTORS)} (mp runs on CPU)")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"preset {self.preset!r} is not one of {', '.join(PRESETS)}")
        if self.preset == "distributed-shared" and not self.remote_url:
            raise ValueError("preset distributed-shared needs remote_url, e.g. redis://host:6379 or lm://host:65432")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.connector == "mp" and not self.local_cpu:
            raise ValueError("local_cpu: false needs connector: v1 (LMCache's MP server always keeps a CPU tier)")
        if self.connector == "mp" and self.remote_url and urlsplit(self.remote_url).scheme not in REDIS_SCHEMES:
            raise ValueError(
                f"remote_url {self.remote_url!r}: with connector: mp the remote tier is a Redis store "
                "(redis://host:port); other stores need connector: v1"
            )

    def disk_folder(self, workdir: Path) -> Path | None:
        """The disk tier's folder, or None when the disk tier is off."""
        if not (self.local_disk_path or self.max_local_disk_size > 0):
            return None
        return Path(self.local_disk_path) if self.local_disk_path else workdir / DISK_DIR

    def tiers(self, workdir: Path) -> str:
        names = (
            ["cpu"] * self.local_cpu + ["disk"] * bool(self.disk_folder(workdir)) + ["remote"] * bool(self.remote_url)
        )
        return "+".join(names) or "none"

    def yaml_config(self, workdir: Path) -> dict[str, object]:
        """The LMCache YAML (connector v1) as a mapping; disk and remote keys only when those tiers are on."""
        config: dict[str, object] = {
            "chunk_size": self.chunk_size,
            "local_cpu": self.local_cpu,
            "max_local_cpu_size": self.max_local_cpu_size,
        }
        folder = self.disk_folder(workdir)
        if folder is not None:
            config["local_disk"] = f"file://{folder.resolve()}/"
            config["max_local_disk_size"] = self.max_local_disk_size
        if self.remote_url:
            config["remote_url"] = self.remote_url
            config["remote_serde"] = self.remote_serde
        return config

    def mp_server(self, workdir: Path, zmq_port: int, http_port: int) -> MPServerPlan:
        """The MP cache server's tiers (connector mp); the Redis password travels in its environment."""
        folder = self.disk_folder(workdir)
        redis_url = None
        if self.remote_url:
            parts = urlsplit(self.remote_url)
            redis_url = f"redis://{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
        return MPServerPlan(
            zmq_port,
            http_port,
            self.max_local_cpu_size,
            self.chunk_size,
            str(folder.resolve()) if folder else None,
            redis_url,
        )


def split_settings(settings: Mapping[str, object]) -> tuple[LMCacheSettings, VLLMSettings]:
    """engine.lmcache's flat mapping -> (LMCache keys with the preset applied, vLLM keys); unknown keys name both."""
    own = {f.name for f in dataclasses.fields(LMCacheSettings)}
    theirs = {f.name for f in dataclasses.fields(VLLMSettings)}
    for key in settings:
        if key not in own | theirs:
            close = difflib.get_close_matches(key, sorted(own | theirs), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SettingsError(
                f"engine.lmcache: unknown key {key!r}{hint}; valid keys: LMCache's "
                f"{', '.join(sorted(own))} and vLLM's {', '.join(sorted(theirs))}"
            )
    values = settings_values(settings)
    preset = values.get("preset")
    lmcache_values = dict(PRESETS.get(preset, {})) if isinstance(preset, str) else {}
    lmcache_values.update({key: value for key, value in values.items() if key in own})
    vllm_values = {key: value for key, value in values.items() if key not in own}
    return build(LMCacheSettings, lmcache_values, "engine.lmcache"), build(VLLMSettings, vllm_values, "engine.lmcache")


def lmcache_plan(
    lmcache: LMCacheSettings, vllm: VLLMSettings, model: str, port: int, workdir: Path, zmq_port: int = 0
) -> LaunchPlan:
    """vLLM's launch with LMCache's connector: `zmq_port` is the MP cache server's (connector mp)."""
    base = vllm_plan(vllm, model, port)
    if lmcache.connector == "mp":
        return dataclasses.replace(
            base,
            command=(*base.command, "--kv-transfer-config", kv_transfer_config(zmq_port)),
            env={**base.env, **SERVER_ENV},
            scrub_env_prefixes=(ENV_PREFIX,),
        )
    env = {
        **base.env,
        "LMCACHE_CONFIG_FILE": str((workdir / CONFIG_FILE).resolve()),
        "PROMETHEUS_MULTIPROC_DIR": str((workdir / PROMETHEUS_DIR).resolve()),
    }
    return dataclasses.replace(
        base,
        command=(*base.command, "--kv-transfer-config", V1_TRANSFER_CONFIG),
        env=env,
        files={CONFIG_FILE: yaml.safe_dump(lmcache.yaml_config(workdir), sort_keys=False)},
        scrub_env_prefixes=(ENV_PREFIX,),
    )


def cache_server_plan(lmcache: LMCacheSettings, python: str, server: MPServerPlan) -> LaunchPlan:
    """The MP cache server's launch (connector mp), in the same interpreter as vLLM (LMCache lives beside it)."""
    env = dict(SERVER_ENV)
    password = urlsplit(lmcache.remote_url).password if lmcache.remote_url else None
    if password:
        env["LMCACHE_RESP_PASSWORD"] = password  # the resp tier's default (kept out of the argv and its log line)
    return LaunchPlan(
        command=(python, "-m", SERVER_MODULE, *server.arguments()),
        env=env,
        help_command=(python, "-m", SERVER_MODULE, "--help"),
        health_path=HEALTH_PATH,
        scrub_env_prefixes=(ENV_PREFIX,),
    )


def lmcache_key_pattern(model: str) -> str:
    """The Redis glob of one model's LMCache chunks (keys start with the model: `model@...`)."""
    escaped = "".join(f"\\{char}" if char in "*?[]\\" else char for char in model)
    return f"{escaped}@*"


def flush_remote_store(remote_url: str, model: str) -> int:
    """Delete `model`'s chunks from the Redis store at `remote_url`; returns how many keys went."""
    import redis

    if urlsplit(remote_url).scheme not in REDIS_SCHEMES:
        raise EngineError(
            f"remote_url {remote_url!r}: kvbench can only flush a redis:// store between runs; "
            "set flush_remote: false to keep the store warm (the cold-cache probe may then fail)"
        )
    client = redis.Redis.from_url(remote_url, socket_timeout=30)
    try:
        deleted = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=lmcache_key_pattern(model), count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += client.delete(*batch)
                batch = []
        if batch:
            deleted += client.delete(*batch)
        return deleted
    except redis.RedisError as exc:
        raise EngineError(f"could not flush LMCache's remote store {remote_url}: {exc}") from None
    finally:
        client.close()


def flush_disk_folder(folder: Path) -> int:
    """Delete the MP server's chunk files (`*.data`) from its disk tier's folder; returns how many went."""
    files = list(folder.glob(f"*{DISK_FILE_SUFFIX}")) if folder.is_dir() else []
    for path in files:
        path.unlink(missing_ok=True)
    return len(files)


class LMCacheAdapter(LaunchedAdapter):
    name = "lmcache"
    reference_help = REFERENCE_HELP  # vLLM's: LMCache's connector runs inside vLLM
    kv_vocabulary = KV_VOCABULARY  # vLLM's --kv-cache-dtype
    capabilities = VLLM_CAPABILITIES

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        self.lmcache, self.settings = split_settings(settings)
        self.workdir = workdir
        self.port = self.settings.port or free_port()
        self.model = resolve_model(self.settings.model)
        # connector mp: the cache server vLLM connects to (None with connector v1: LMCache runs in vLLM's worker).
        self.cache_server: LaunchedServer | None = None
        zmq_port = 0
        if self.lmcache.connector == "mp":
            zmq_port, http_port = free_port(), free_port()
            mp = self.lmcache.mp_server(workdir, zmq_port, http_port)
            self.cache_server = LaunchedServer(
                cache_server_plan(self.lmcache, vllm_python(self.settings), mp),
                workdir / CACHE_SERVER_DIR,
                http_port,
                check_flags=self.settings.check_flags,
            )
        plan = lmcache_plan(self.lmcache, self.settings, self.model, self.port, workdir, zmq_port)
        self.server = LaunchedServer(plan, workdir, self.port, check_flags=self.settings.check_flags)

    @property
    def reference_config(self) -> Mapping[str, Mapping[str, str]]:
        return {CONFIG_FILE: REFERENCE_KEYS} if self.lmcache.connector == "v1" else {}

    def describe(self) -> Mapping[str, object]:
        return {
            **vllm_description(self.settings, self._version, WRITTEN_AGAINST),
            "connector": self.lmcache.connector,
            "preset": self.lmcache.preset,
            "lmcache_tiers": self.lmcache.tiers(self.workdir),
            "chunk_size": self.lmcache.chunk_size,
            **(
                {"cache_reset_note": "LMCache's Redis tier is kept (flush_remote: false)"} if self._keeps_remote else {}
            ),
        }

    @property
    def _keeps_remote(self) -> bool:
        return bool(self.lmcache.remote_url) and not self.lmcache.flush_remote

    def engine_version(self) -> str | None:
        return installed_version(vllm_python(self.settings), (*DISTRIBUTIONS, "lmcache"))

    def start(self) -> None:
        if self.cache_server is not None:
            folder = self.lmcache.disk_folder(self.workdir)
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
            self.cache_server.start()
            self.cache_server.wait_healthy(CACHE_SERVER_START_S)
        else:
            (self.workdir / PROMETHEUS_DIR).mkdir(parents=True, exist_ok=True)
        super().start()

    def scrape_metrics(self) -> Mapping[str, float] | None:
        """vLLM's samples and, with connector mp, the cache server's (`lmcache_mp_*`)."""
        samples = self.server.scrape()
        if samples is None or self.cache_server is None:
            return samples
        return {**samples, **(self.cache_server.scrape() or {})}

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.cache_server is not None:
                self.cache_server.stop()

    def reset_cache(self) -> bool:
        reset_prefix_cache(self.server, "/reset_prefix_cache?reset_external=true", self.settings.reset_timeout_s)
        if self.cache_server is not None:
            self._drain_and_clear(self.cache_server)
            folder = self.lmcache.disk_folder(self.workdir)
            if folder is not None:
                flush_disk_folder(folder)
        if self.lmcache.remote_url and self.lmcache.flush_remote:
            flush_remote_store(self.lmcache.remote_url, self.model)
        cold = self.verify_cold(self.settings.max_model_len)
        # flush_remote: false keeps the Redis tier warm on purpose (a restarted engine reading what the last one
        # stored): vLLM and the local tiers were reset, the point is still not a cold-cache one.
        return cold and not self._keeps_remote

    def _drain_and_clear(self, cache_server: LaunchedServer) -> None:
        """Wait for the MP server's L2 writes to finish, then clear its DRAM again (vLLM's reset cleared what was
        not locked by those writes); the L2 tiers are flushed after this, so no late write re-fills them."""
        deadline = time.monotonic() + self.settings.reset_timeout_s
        wait = 0.05
        while True:
            reply = request("GET", cache_server.base_url + STATUS_PATH, timeout_s=30)
            try:
                pending = stores_in_flight(json.loads(reply.body)) if reply.ok else None
            except ValueError:
                pending = None
            if pending is None:
                raise EngineError(
                    f"LMCache's server answered GET {STATUS_PATH} with {reply.status} "
                    f"{reply.body[:200]!r}, not its status with store counts\n{cache_server.log_tail()}"
                )
            if pending == 0:
                break
            if time.monotonic() + wait > deadline:
                raise EngineError(
                    f"LMCache's server still writes {pending} chunks to its L2 tiers after "
                    f"{self.settings.reset_timeout_s:g} s; raise reset_timeout_s"
                )
            time.sleep(wait)
            wait = min(wait * 2, 2.0)
        cache_server.post(CLEAR_PATH)
