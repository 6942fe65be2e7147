"""`kvengine`: kvbench's own engine, launched as `python -m kvbench.engines.kvengine.server.main`."""

from __future__ import annotations

import dataclasses
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.base import Capabilities, Endpoint, EngineError
from kvbench.engines.http import request
from kvbench.engines.kvengine.settings import openmp
from kvbench.engines.kvengine.settings.config import (
    ADMIN_KEY_ENV,
    PORT_RANGE,
    TIER_SECRET_ENV,
    EngineConfig,
    ServeOptions,
)
from kvbench.engines.kvengine.settings.flags import to_argv
from kvbench.engines.kvengine.settings.tenants import load_tenants  # torch-free, like config
from kvbench.engines.launch import LOG_FILE, free_port
from kvbench.engines.process import ManagedProcess
from kvbench.engines.prometheus import parse_samples
from kvbench.settings import bounded, build

SERVER_MODULE = "kvbench.engines.kvengine.server.main"
SERVED_MODEL_NAME = "kvengine"  # what the load generator asks for, unless the settings name the model
STEP_LOG = "steps.jsonl"
DISK_DIR = "kv-disk"  # the disk tier's folder in the adapter's workdir, unless the settings name one
TINY_VOCAB = 512  # kvbench.engines.kvengine.model.tiny.TINY_CONFIG (not imported here: the adapter needs no torch)


@dataclass(frozen=True)
class KVEngineSettings:
    """A kvengine entry's settings, one flat mapping in YAML: the engine's own (every `EngineConfig` field,
    each a `kvbench serve` flag of the same name) and the adapter's below."""

    engine: EngineConfig
    api_key: str | None = None  # the key the load generator sends (a key of the tenants file, or --api-key)
    port: int | None = bounded(None, **PORT_RANGE)  # where `kvbench serve` listens; None: a free port
    extra_args: tuple[str, ...] = ()  # more `kvbench serve` flags, appended as given

    @classmethod
    def parse(cls, values: Mapping[str, object], workdir: Path, where: str = "engine.kvengine") -> KVEngineSettings:
        """Check a settings mapping (SettingsError names the field). The engine's defaults that depend on the
        adapter are filled in: the served model name, and the disk tier's folder inside `workdir`."""
        own = {f.name for f in dataclasses.fields(cls)} - {"engine"}
        mine = {key: value for key, value in values.items() if key in own}
        engine = {
            "served_model_name": SERVED_MODEL_NAME,
            **{key: value for key, value in values.items() if key not in own},
        }
        if engine.get("disk_capacity") and not engine.get("disk_dir"):
            engine["disk_dir"] = str(workdir / DISK_DIR)
        if isinstance(mine.get("extra_args"), list):
            mine["extra_args"] = tuple(mine["extra_args"])
        return build(cls, {"engine": build(EngineConfig, engine, where), **mine}, where)


class KVEngineAdapter:
    name = "kvengine"

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        self.settings = KVEngineSettings.parse(settings, workdir)
        tenants_file = self.settings.engine.tenants_file
        # Loaded here too: a bad file is a SettingsError before anything starts, not a failed launch.
        self._shared_prefixes = load_tenants(tenants_file).shared_prefixes if tenants_file else ()
        self.workdir = workdir
        self.port = self.settings.port or free_port()
        # The key of the cache reset and /metrics: a fresh one per launch, through the environment (argv
        # is logged and visible in ps). The run's API key may be a tenant's, which may not reset everyone.
        self._admin_key = secrets.token_urlsafe(24)
        env = {**openmp.environment(), ADMIN_KEY_ENV: self._admin_key}
        if self.settings.engine.tier_secret:
            env[TIER_SECRET_ENV] = self.settings.engine.tier_secret
        self._process = ManagedProcess(self.command(), env, workdir / LOG_FILE)

    def serve_options(self) -> ServeOptions:
        """The server's own flags: this port, the API key unless a tenants file decides keys, and the step log
        (the engine's own step times, for `kvbench calibrate`)."""
        s = self.settings
        api_key = s.api_key if not s.engine.tenants_file else None
        return ServeOptions(port=self.port, api_key=api_key, step_log=str(self.workdir / STEP_LOG))

    def command(self) -> list[str]:
        """`kvbench serve` with one flag per engine setting that differs from its default."""
        engine = dataclasses.replace(self.settings.engine, tier_secret=None)  # through the environment instead
        return [
            sys.executable,
            "-m",
            SERVER_MODULE,
            *to_argv(engine),
            *to_argv(self.serve_options()),
            *self.settings.extra_args,
        ]

    @property
    def vocab_size(self) -> int | None:
        """Token ids the workload may use, when the model's vocabulary is smaller than workloads assume."""
        return TINY_VOCAB if self.settings.engine.model == "tiny-random" else None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.base_url, self.settings.engine.served_model_name, self.settings.api_key)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            True,
            True,
            output_token_ids=True,
            cache_reset=True,
            prompt_logprobs=True,
            isolation=self.settings.engine.isolation.value,
            shared_prefixes=self._shared_prefixes,
        )

    def describe(self) -> Mapping[str, object]:
        e = self.settings.engine
        # The capacity settings as given (`kv_capacity_bytes` wins); what the engine allocated is the entry's
        # `kv_capacity`, read from its /metrics.
        return {
            "kv_dtype": e.kv_format.label,
            "model": e.model,
            "kv_capacity_setting": e.kv_capacity,
            "kv_capacity_bytes_setting": e.kv_capacity_bytes,
            "prefix_caching": e.prefix_caching,
            "host_capacity": e.host_capacity,
            "disk_capacity": e.disk_capacity,
            "remote": bool(e.remote_url),
            "isolation": e.isolation.value,
            "device_ttl_s": e.device_ttl_s,
            "host_ttl_s": e.host_ttl_s,
            "tensor_parallel_size": e.tensor_parallel_size,
        }

    def start(self) -> None:
        self._process.start()

    def wait_healthy(self, timeout_s: float) -> None:
        self._process.wait_healthy(self.base_url + "/health", timeout_s)

    def reset_cache(self) -> bool:
        reply = request("POST", self.base_url + "/reset_prefix_cache", timeout_s=30, api_key=self._admin_key)
        if not reply.ok:
            raise EngineError(f"kvengine cache reset failed: {reply.error or reply.status}")
        return True

    def scrape_metrics(self) -> Mapping[str, float] | None:
        reply = request("GET", self.base_url + "/metrics", api_key=self._admin_key)
        return parse_samples(reply.body) if reply.ok else None

    def stop(self) -> None:
        self._process.stop()
