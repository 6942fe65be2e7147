"""`kvengine`: kvbench's own engine, launched as `python -m kvbench.engines.kvengine.server.main`."""

from __future__ import annotations

import secrets
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.base import Capabilities, Endpoint, EngineError
from kvbench.engines.http import request
# main imports no torch at import time
from kvbench.engines.kvengine.server.main import (ADMIN_KEY_ENV, COMPUTE_DTYPES, ISOLATION_MODES, KV_DTYPES,
                                                  SCALE_MODES)
from kvbench.engines.process import ManagedProcess
from kvbench.engines.kvengine.runtime.tenants_config import load_tenants  # torch-free, like main
from kvbench.engines.prometheus import parse_samples
from kvbench.settings import bounded, build

STEP_LOG = "steps.jsonl"
TINY_VOCAB = 512  # kvbench.engines.kvengine.model.tiny.TINY_CONFIG (not imported here: the adapter needs no torch)


@dataclass(frozen=True)
class KVEngineSettings:
    """Settings of our engine; each maps to a `kvbench serve` flag of the same name."""

    model: str = "default"
    kv_dtype: str = "fp32"
    kv_scale: str = "tensor"
    kv_capacity: int = bounded(32768, ge=1, unit="tokens")
    kv_capacity_bytes: int | None = bounded(None, ge=1, unit="bytes")
    page_size: int = bounded(16, ge=1, unit="tokens")
    max_num_seqs: int = bounded(16, ge=1)
    max_step_tokens: int = bounded(512, ge=1, unit="tokens")
    prefix_caching: bool = True
    device: str = "cpu"
    compute_dtype: str = "float32"
    max_model_len: int | None = bounded(None, ge=1, unit="tokens")
    threads: int | None = bounded(None, ge=1)
    host_capacity: int = bounded(0, ge=0, unit="tokens")  # 0: no host tier
    disk_capacity: int = bounded(0, ge=0, unit="tokens")  # 0: no disk tier
    disk_dir: str | None = None  # default: <run workdir>/kv-disk when disk_capacity > 0
    remote_url: str | None = None  # shared Redis tier, e.g. redis://127.0.0.1:6379/0
    device_ttl_s: float = bounded(30.0, gt=0, unit="s")
    host_ttl_s: float = bounded(600.0, gt=0, unit="s")
    tier_interval_s: float = bounded(1.0, gt=0, unit="s")
    tenants_file: str | None = None
    isolation: str = "strict"  # or "shared-prefix"
    api_key: str | None = None  # the key the load generator sends (a key of the tenants file, or --api-key)
    port: int | None = bounded(None, ge=1, le=65535)  # None: a free port
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, choices in (("kv_dtype", KV_DTYPES), ("kv_scale", SCALE_MODES), ("compute_dtype", COMPUTE_DTYPES),
                              ("isolation", ISOLATION_MODES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(choices)}")


class KVEngineAdapter:
    name = "kvengine"

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        values = dict(settings)
        if "extra_args" in values:
            values["extra_args"] = tuple(values["extra_args"])
        self.settings = build(KVEngineSettings, values, "engine.kvengine")
        if self.settings.tenants_file:
            load_tenants(self.settings.tenants_file)  # a bad file is a SettingsError now, not a failed launch
        self.workdir = workdir
        self.port = self.settings.port or _free_port()
        # The key of the cache reset and /metrics: a fresh one per launch, through the environment (argv
        # is logged and visible in ps). The run's API key may be a tenant's, which may not reset everyone.
        self._admin_key = secrets.token_urlsafe(24)
        env = {"OMP_WAIT_POLICY": "PASSIVE", ADMIN_KEY_ENV: self._admin_key}
        self._process = ManagedProcess(self.command(), env, workdir / "engine.log")

    def command(self) -> list[str]:
        s = self.settings
        command = [
            sys.executable, "-m", "kvbench.engines.kvengine.server.main",
            "--model", s.model, "--kv-dtype", s.kv_dtype, "--kv-scale", s.kv_scale,
            "--kv-capacity", str(s.kv_capacity), "--page-size", str(s.page_size),
            "--max-num-seqs", str(s.max_num_seqs), "--max-step-tokens", str(s.max_step_tokens),
            "--device", s.device, "--compute-dtype", s.compute_dtype,
            "--served-model-name", "kvengine", "--port", str(self.port),
            "--step-log", str(self.workdir / STEP_LOG),  # the engine's own step times, for `kvbench calibrate`
        ]
        if s.kv_capacity_bytes is not None:
            command += ["--kv-capacity-bytes", str(s.kv_capacity_bytes)]
        if not s.prefix_caching:
            command.append("--no-prefix-caching")
        if s.max_model_len is not None:
            command += ["--max-model-len", str(s.max_model_len)]
        if s.threads is not None:
            command += ["--threads", str(s.threads)]
        command += ["--isolation", s.isolation, "--device-ttl", str(s.device_ttl_s), "--host-ttl", str(s.host_ttl_s),
                    "--tier-interval", str(s.tier_interval_s)]
        if s.host_capacity:
            command += ["--host-capacity", str(s.host_capacity)]
        if s.disk_capacity:
            command += ["--disk-capacity", str(s.disk_capacity),
                        "--disk-dir", s.disk_dir or str(self.workdir / "kv-disk")]
        if s.remote_url:
            command += ["--remote-url", s.remote_url]
        if s.tenants_file:
            command += ["--tenants-file", s.tenants_file]
        elif s.api_key:
            command += ["--api-key", s.api_key]
        return command + list(s.extra_args)

    @property
    def vocab_size(self) -> int | None:
        """Token ids the workload may use, when the model's vocabulary is smaller than workloads assume."""
        return TINY_VOCAB if self.settings.model == "tiny-random" else None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.base_url, "kvengine", self.settings.api_key)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(True, True, output_token_ids=True, cache_reset=True, prompt_logprobs=True)

    def describe(self) -> Mapping[str, object]:
        s = self.settings
        kv = s.kv_dtype if not s.kv_dtype.startswith("fp8") else f"{s.kv_dtype}/{s.kv_scale}"
        return {"kv_dtype": kv, "model": s.model, "kv_capacity": s.kv_capacity, "prefix_caching": s.prefix_caching,
                "host_capacity": s.host_capacity, "disk_capacity": s.disk_capacity, "remote": bool(s.remote_url),
                "isolation": s.isolation, "device_ttl_s": s.device_ttl_s, "host_ttl_s": s.host_ttl_s}

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
