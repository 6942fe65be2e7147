"""`sglang`: SGLang's server, launched as `python -m sglang.launch_server`.

Written against sglang 0.5.23 (`shared/reference/sglang-0.5.23-launch-server-help.txt`, `...-cpu-metrics.txt`);
every launch first checks its flags against the installed version's --help. Always on: `--enable-metrics`
(/metrics) and `--enable-cache-report` (usage.prompt_tokens_details.cached_tokens per request). Cache reset is
POST /flush_cache, retried while SGLang answers 400 "will not be performed" (requests still running) for up to
`reset_timeout_s`. The counters to difference are `sglang:cached_tokens_total` (by cache_source) and
`sglang:realtime_tokens_total` (mode=prefill_compute / prefill_cache / decode); the `sglang:cache_hit_rate` gauge
covers one batch only and is not used. SGLang is meant for GPUs; the `python` setting (or $KVBENCH_SGLANG_PYTHON)
names its interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.base import Capabilities, KVVocabulary
from kvbench.engines.http import HttpReply
from kvbench.engines.launch import (
    LaunchedAdapter,
    LaunchedServer,
    LaunchPlan,
    free_port,
    installed_version,
    kv_dtype_label,
    optional_flags,
)
from kvbench.engines.vllm import resolve_model, settings_values
from kvbench.settings import bounded, build

WRITTEN_AGAINST = "sglang 0.5.23"
SERVER_MODULE = "sglang.launch_server"
PYTHON_ENV = "KVBENCH_SGLANG_PYTHON"
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "bf16")
REFERENCE_HELP = {"sglang 0.5.23": "sglang-0.5.23-launch-server-help.txt"}  # tests/data/shared/reference/


@dataclass(frozen=True)
class SGLangSettings:
    """One SGLang configuration; `None` leaves SGLang's default. `hierarchical_cache` adds the host-memory tier
    (HiCache): `hicache_ratio` (host/device size) or `hicache_size` (GB), and an optional storage backend below it."""

    model: str = "default"
    python: str | None = None
    served_model_name: str = "sglang"
    kv_cache_dtype: str = "auto"
    radix_cache: bool = True
    hierarchical_cache: bool = False
    hicache_ratio: float | None = None
    hicache_size: int | None = None
    hicache_write_policy: str | None = None
    hicache_storage_backend: str | None = None
    tp_size: int = 1
    context_length: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    mem_fraction_static: float | None = None
    page_size: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    device: str | None = None
    vocab_size: int | None = None
    port: int | None = None
    check_flags: bool = True
    verify_cold: bool = True
    reset_timeout_s: float = bounded(60.0, gt=0, unit="s")  # how long a refused flush (requests running) is retried
    env: Mapping[str, str] | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        hicache = {
            "hicache_ratio": self.hicache_ratio,
            "hicache_size": self.hicache_size,
            "hicache_write_policy": self.hicache_write_policy,
            "hicache_storage_backend": self.hicache_storage_backend,
        }
        used = [name for name, value in hicache.items() if value is not None]
        if used and not self.hierarchical_cache:
            raise ValueError(f"{', '.join(used)} need hierarchical_cache: true")
        if self.hierarchical_cache and not self.radix_cache:
            raise ValueError("hierarchical_cache needs radix_cache: true (HiCache extends the radix tree)")
        if isinstance(self.extra_args, str):
            raise ValueError("extra_args must be a list of arguments, not one string")
        object.__setattr__(self, "extra_args", tuple(str(arg) for arg in self.extra_args))


def sglang_python(settings: SGLangSettings) -> str:
    return settings.python or os.environ.get(PYTHON_ENV) or sys.executable


def sglang_arguments(settings: SGLangSettings, model: str, port: int) -> list[str]:
    """The server's arguments after `python -m sglang.launch_server` (pure)."""
    s = settings
    args = [
        "--model-path",
        model,
        "--served-model-name",
        s.served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp-size",
        str(s.tp_size),
        "--enable-metrics",
        "--enable-cache-report",
    ]
    if s.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", s.kv_cache_dtype]
    if not s.radix_cache:
        args.append("--disable-radix-cache")
    if s.hierarchical_cache:
        args.append("--enable-hierarchical-cache")
    optional = {
        "--hicache-ratio": s.hicache_ratio,
        "--hicache-size": s.hicache_size,
        "--hicache-write-policy": s.hicache_write_policy,
        "--hicache-storage-backend": s.hicache_storage_backend,
        "--context-length": s.context_length,
        "--chunked-prefill-size": s.chunked_prefill_size,
        "--max-prefill-tokens": s.max_prefill_tokens,
        "--mem-fraction-static": s.mem_fraction_static,
        "--page-size": s.page_size,
        "--dtype": s.dtype,
        "--quantization": s.quantization,
        "--device": s.device,
    }
    args += optional_flags(optional, lambda value: f"{value:g}" if isinstance(value, float) else str(value))
    return args + list(s.extra_args)


def sglang_plan(settings: SGLangSettings, model: str, port: int) -> LaunchPlan:
    python = sglang_python(settings)
    return LaunchPlan(
        command=(python, "-m", SERVER_MODULE, *sglang_arguments(settings, model, port)),
        env=dict(settings.env or {}),
        help_command=(python, "-m", SERVER_MODULE, "--help"),
    )


class SGLangAdapter(LaunchedAdapter):
    name = "sglang"
    reference_help = REFERENCE_HELP
    kv_vocabulary = KVVocabulary("kv_cache_dtype", KV_CACHE_DTYPES, ("auto", "bf16"))

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        self.settings = build(SGLangSettings, settings_values(settings), "engine.sglang")
        self.port = self.settings.port or free_port()
        plan = sglang_plan(self.settings, resolve_model(self.settings.model), self.port)
        self.server = LaunchedServer(plan, workdir, self.port, check_flags=self.settings.check_flags)

    @property
    def capabilities(self) -> Capabilities:
        # SGLang's OpenAI API returns text only: the next turn is built from re-tokenized text (or the tokenizer).
        return Capabilities(
            token_id_prompts=True, cached_token_reporting=True, output_token_ids=False, cache_reset=True
        )

    def describe(self) -> Mapping[str, object]:
        s = self.settings
        return {
            "kv_dtype": kv_dtype_label(s.kv_cache_dtype, s.dtype),
            "model": s.model,
            "radix_cache": s.radix_cache,
            "hierarchical_cache": s.hierarchical_cache,
            "tp_size": s.tp_size,
            "engine_version": self._version,
            "written_against": WRITTEN_AGAINST,
        }

    def engine_version(self) -> str | None:
        return installed_version(sglang_python(self.settings), ("sglang",))

    def reset_cache(self) -> bool:
        self.server.post_until_accepted("/flush_cache", self.settings.reset_timeout_s, _flush_refusal)
        # Without the radix cache there is nothing to reuse, and nothing to check.
        return self.verify_cold(self.settings.context_length) if self.settings.radix_cache else True


def _flush_refusal(reply: HttpReply) -> str | None:
    """SGLang (0.5: http_server.py `flush_cache`) answers 400 with the same "Cache flushed. ... (When there are
    running or waiting requests, the operation will not be performed.)" text when it did not flush."""
    if reply.status == 400 and "will not be performed" in reply.body:
        return "400: requests still running or waiting"
    return None
