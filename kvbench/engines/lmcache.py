"""`lmcache`: vLLM with LMCache's connector (`LMCacheConnectorV1`), KV offloaded to CPU, local disk or a remote store.

The LMCache configuration is a YAML file written to the adapter's folder and passed through
LMCACHE_CONFIG_FILE; vLLM gets `--kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'`.
LMCache's `lmcache:*` counters appear in vLLM's /metrics only with a shared PROMETHEUS_MULTIPROC_DIR (LMCache
runs in vLLM's worker process), so the adapter sets one in its folder. LMCache reads every `LMCACHE_<KEY>` variable
over the config file (lmcache/v1/config_base.py, `update_config_from_env`), so the child gets the driver's
environment without any inherited `LMCACHE_*` variable. The reset drops the connector's cache too
(`/reset_prefix_cache?reset_external=true`, retried like vLLM's) and, for a Redis remote store, deletes this
model's chunks there (`MODEL@*`, LMCache's key layout `model@world_size@worker@hash@dtype`), which the server
restart or reset would otherwise leave for the next cold-cache probe to find (`flush_remote: false` keeps them).

Written against LMCache 0.5.6's config keys (`REFERENCE_KEYS`: chunk_size, local_cpu, max_local_cpu_size [GB],
local_disk "file:///path/", max_local_disk_size [GB], remote_url "redis://host:port" or "lm://host:port",
remote_serde) and vLLM's flags (vllm.py). LMCache needs CUDA: it does not run on the CPU build of vLLM.

Presets (the article's rows): `local-cpu-nvme` (CPU RAM, then a local NVMe folder) and `distributed-shared`
(CPU RAM, then a remote store that several vLLM servers share; `remote_url` is required). Explicit keys override
the preset's values.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from urllib.parse import urlsplit
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

from kvbench.engines.base import Capabilities, EngineError
from kvbench.engines.launch import (
    LaunchedAdapter,
    LaunchedServer,
    LaunchPlan,
    free_port,
    installed_version,
    kv_dtype_label,
)
from kvbench.engines.vllm import (
    DISTRIBUTIONS, KV_VOCABULARY, PYTHON_ENV, REFERENCE_HELP, VLLMSettings, reset_prefix_cache, resolve_model, settings_values, vllm_plan, vllm_python,  # noqa: F401 - PYTHON_ENV: preflight names it
)
from kvbench.settings import SettingsError, build

WRITTEN_AGAINST = "LMCache 0.5.6 config keys (lmcache/v1/config.py); vLLM flags as the vllm adapter"
REFERENCE_KEYS = {"lmcache 0.5.6": "lmcache-0.5.6-config-keys.txt"}  # tests/data/shared/reference/
ENV_PREFIX = "LMCACHE_"
REDIS_SCHEMES = ("redis", "rediss")
CONFIG_FILE = "lmcache.yaml"
PROMETHEUS_DIR = "prometheus-multiproc"
KV_TRANSFER_CONFIG = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}, separators=(",", ":"))

PRESETS: Mapping[str, Mapping[str, object]] = MappingProxyType({
    "local-cpu-nvme": {"local_cpu": True, "max_local_cpu_size": 100.0, "max_local_disk_size": 1000.0},
    "distributed-shared": {"local_cpu": True, "max_local_cpu_size": 100.0, "remote_serde": "naive"},
})


@dataclass(frozen=True)
class LMCacheSettings:
    """LMCache's own keys (YAML names), plus `preset` and `local_disk_path`: a folder for the disk tier
    (default: `lmcache-disk` in the adapter's folder when the preset or max_local_disk_size asks for one).
    Every other setting of engine.lmcache is a vLLM setting (see VLLMSettings)."""

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
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"preset {self.preset!r} is not one of {', '.join(PRESETS)}")
        if self.preset == "distributed-shared" and not self.remote_url:
            raise ValueError("preset distributed-shared needs remote_url, e.g. redis://host:6379 or lm://host:65432")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")

    def yaml_config(self, workdir: Path) -> dict[str, object]:
        """The LMCache YAML as a mapping; disk and remote keys only when those tiers are on."""
        config: dict[str, object] = {
            "chunk_size": self.chunk_size, "local_cpu": self.local_cpu, "max_local_cpu_size": self.max_local_cpu_size,
        }
        if self.local_disk_path or self.max_local_disk_size > 0:
            folder = Path(self.local_disk_path) if self.local_disk_path else workdir / "lmcache-disk"
            config["local_disk"] = f"file://{folder.resolve()}/"
            config["max_local_disk_size"] = self.max_local_disk_size
        if self.remote_url:
            config["remote_url"] = self.remote_url
            config["remote_serde"] = self.remote_serde
        return config


def split_settings(settings: Mapping[str, object]) -> tuple[LMCacheSettings, VLLMSettings]:
    """engine.lmcache's flat mapping -> (LMCache keys with the preset applied, vLLM keys); unknown keys name both."""
    own = {f.name for f in dataclasses.fields(LMCacheSettings)}
    theirs = {f.name for f in dataclasses.fields(VLLMSettings)}
    for key in settings:
        if key not in own | theirs:
            close = difflib.get_close_matches(key, sorted(own | theirs), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SettingsError(f"engine.lmcache: unknown key {key!r}{hint}; valid keys: LMCache's "
                                f"{', '.join(sorted(own))} and vLLM's {', '.join(sorted(theirs))}")
    values = settings_values(settings)
    preset = values.get("preset")
    lmcache_values = dict(PRESETS.get(preset, {})) if isinstance(preset, str) else {}
    lmcache_values.update({key: value for key, value in values.items() if key in own})
    vllm_values = {key: value for key, value in values.items() if key not in own}
    return build(LMCacheSettings, lmcache_values, "engine.lmcache"), build(VLLMSettings, vllm_values, "engine.lmcache")


def lmcache_plan(lmcache: LMCacheSettings, vllm: VLLMSettings, model: str, port: int, workdir: Path) -> LaunchPlan:
    base = vllm_plan(vllm, model, port)
    env = {
        **base.env,
        "LMCACHE_CONFIG_FILE": str((workdir / CONFIG_FILE).resolve()),
        "PROMETHEUS_MULTIPROC_DIR": str((workdir / PROMETHEUS_DIR).resolve()),
    }
    return dataclasses.replace(
        base,
        command=(*base.command, "--kv-transfer-config", KV_TRANSFER_CONFIG),
        env=env,
        files={CONFIG_FILE: yaml.safe_dump(lmcache.yaml_config(workdir), sort_keys=False)},
        scrub_env_prefixes=(ENV_PREFIX,),
    )


def lmcache_key_pattern(model: str) -> str:
    """The Redis glob of one model's LMCache chunks (keys are `model@world_size@worker@hash@dtype[@...]`)."""
    escaped = "".join(f"\\{char}" if char in "*?[]\\" else char for char in model)
    return f"{escaped}@*"


def flush_remote_store(remote_url: str, model: str) -> int:
    """Delete `model`'s chunks from the Redis store at `remote_url`; returns how many keys went."""
    import redis

    if urlsplit(remote_url).scheme not in REDIS_SCHEMES:
        raise EngineError(f"remote_url {remote_url!r}: kvbench can only flush a redis:// store between runs; "
                          "set flush_remote: false to keep the store warm (the cold-cache probe may then fail)")
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


class LMCacheAdapter(LaunchedAdapter):
    name = "lmcache"
    reference_help = REFERENCE_HELP  # vLLM's: LMCache runs inside vLLM
    reference_config = {CONFIG_FILE: REFERENCE_KEYS}
    kv_vocabulary = KV_VOCABULARY  # vLLM's --kv-cache-dtype

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        self.lmcache, self.settings = split_settings(settings)
        self.workdir = workdir
        self.port = self.settings.port or free_port()
        self.model = resolve_model(self.settings.model)
        plan = lmcache_plan(self.lmcache, self.settings, self.model, self.port, workdir)
        self.server = LaunchedServer(plan, workdir, self.port, check_flags=self.settings.check_flags)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_id_prompts=True, cached_token_reporting=True, output_token_ids=True, cache_reset=True,
                            prompt_logprobs=True)

    def describe(self) -> Mapping[str, object]:
        s = self.settings
        tiers = ["cpu"] * self.lmcache.local_cpu + ["disk"] * ("local_disk" in self.lmcache.yaml_config(self.workdir))
        tiers += ["remote"] * bool(self.lmcache.remote_url)
        return {
            "kv_dtype": kv_dtype_label(s.kv_cache_dtype, s.dtype),
            "model": s.model, "preset": self.lmcache.preset, "lmcache_tiers": "+".join(tiers) or "none",
            "chunk_size": self.lmcache.chunk_size, "engine_version": self._version, "written_against": WRITTEN_AGAINST,
        }

    def engine_version(self) -> str | None:
        return installed_version(vllm_python(self.settings), (*DISTRIBUTIONS, "lmcache"))

    def start(self) -> None:
        (self.workdir / PROMETHEUS_DIR).mkdir(parents=True, exist_ok=True)
        super().start()

    def reset_cache(self) -> bool:
        reset_prefix_cache(self.server, "/reset_prefix_cache?reset_external=true", self.settings.reset_timeout_s)
        if self.lmcache.remote_url and self.lmcache.flush_remote:
            flush_remote_store(self.lmcache.remote_url, self.model)
        return self.verify_cold(self.settings.max_model_len)

