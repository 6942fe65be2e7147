"""`trtllm`: TensorRT-LLM's OpenAI server, `trtllm-serve serve MODEL ... --extra_llm_api_options options.yaml`.

The options YAML (written to the adapter's folder) carries the `kv_cache_config` (a `KvCacheConfig`: `dtype`,
`enable_block_reuse`, `host_cache_size` in bytes, `free_gpu_memory_fraction`, `tokens_per_block`) and turns on
the statistics its Prometheus endpoint (/prometheus/metrics) needs: `return_perf_metrics` feeds the per-request
counters (`trtllm_prompt_tokens_total`, `trtllm_prompt_cached_tokens_total`), `enable_iter_perf_stats` the
`trtllm_kv_cache_hit_rate` gauge.

Written against the `serve` command of TensorRT-LLM's `trtllm-serve` (tensorrt_llm/commands/serve.py) and
`tensorrt_llm.llmapi.KvCacheConfig`. `trtllm-serve` is a click group: its own --help lists only its commands, so
flags are checked against `trtllm-serve serve --help` (`REFERENCE_HELP`: rendered from serve.py's click options,
see tests/data/shared/reference/README.md). The server names the model by the directory's basename when MODEL is a
local directory (tensorrt_llm/serve/openai_server.py: `self.model = model_dir.name`; there is no
--served-model-name), else by MODEL as given. TensorRT-LLM has no HTTP cache reset: a cold cache between runs
needs `restart_to_reset: true` (stop and start the server before each run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvbench.engines.base import Capabilities, KVVocabulary
from kvbench.engines.launch import (
    LaunchedAdapter,
    LaunchedServer,
    LaunchPlan,
    free_port,
    installed_version,
    optional_flags,
)
from kvbench.engines.vllm import resolve_model, settings_values
from kvbench.settings import build

WRITTEN_AGAINST = "tensorrt-llm trtllm-serve serve (click options, serve.py@00209af) and llmapi.KvCacheConfig"
OPTIONS_FILE = "trtllm-options.yaml"
KV_DTYPES = ("auto", "fp8", "nvfp4")
SERVE_COMMAND = "serve"  # the click group's command that starts the OpenAI server
REFERENCE_HELP = {"tensorrt-llm serve.py@00209af": "trtllm-serve-00209af-serve-help.txt"}


@dataclass(frozen=True)
class TRTLLMSettings:
    """One TensorRT-LLM configuration. `kv_dtype` is KvCacheConfig.dtype; `host_cache_gib` the host (CPU) tier for
    offloaded reusable blocks; `None` leaves TensorRT-LLM's default."""

    model: str = "default"
    executable: str = "trtllm-serve"
    backend: str = "pytorch"
    kv_dtype: str = "auto"
    block_reuse: bool = True
    host_cache_gib: float | None = None
    free_gpu_memory_fraction: float | None = None
    tokens_per_block: int | None = None
    tp_size: int = 1
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    restart_to_reset: bool = False
    health_timeout_s: float = 1800.0  # for restart_to_reset: a 72B model loads in minutes
    vocab_size: int | None = None
    port: int | None = None
    check_flags: bool = True
    verify_cold: bool = True
    env: Mapping[str, str] | None = None
    extra_options: Mapping[str, object] | None = None  # more LLM-API options, merged into the YAML
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {self.kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
        if self.host_cache_gib is not None and self.host_cache_gib < 0:
            raise ValueError(f"host_cache_gib must be >= 0, got {self.host_cache_gib}")
        if isinstance(self.extra_args, str):
            raise ValueError("extra_args must be a list of arguments, not one string")
        object.__setattr__(self, "extra_args", tuple(str(arg) for arg in self.extra_args))

    def options(self) -> dict[str, object]:
        """The --extra_llm_api_options YAML as a mapping."""
        kv: dict[str, object] = {"dtype": self.kv_dtype, "enable_block_reuse": self.block_reuse}
        if self.host_cache_gib is not None:
            kv["host_cache_size"] = int(self.host_cache_gib * 2**30)
        if self.free_gpu_memory_fraction is not None:
            kv["free_gpu_memory_fraction"] = self.free_gpu_memory_fraction
        if self.tokens_per_block is not None:
            kv["tokens_per_block"] = self.tokens_per_block
        options: dict[str, object] = {
            "kv_cache_config": kv,
            "return_perf_metrics": True,
            "enable_iter_perf_stats": True,
        }
        for key, value in dict(self.extra_options or {}).items():
            if key == "kv_cache_config" and isinstance(value, Mapping):
                kv.update(value)
            else:
                options[key] = value
        return options


def trtllm_plan(settings: TRTLLMSettings, model: str, port: int, workdir: Path) -> LaunchPlan:
    s = settings
    command = [
        s.executable,
        SERVE_COMMAND,
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend",
        s.backend,
        "--tp_size",
        str(s.tp_size),
        "--extra_llm_api_options",
        str((workdir / OPTIONS_FILE).resolve()),
    ]
    command += optional_flags(
        {"--max_batch_size": s.max_batch_size, "--max_num_tokens": s.max_num_tokens, "--max_seq_len": s.max_seq_len}
    )
    return LaunchPlan(
        command=(*command, *s.extra_args),
        env=dict(s.env or {}),
        files={OPTIONS_FILE: yaml.safe_dump(s.options(), sort_keys=False)},
        help_command=(s.executable, SERVE_COMMAND, "--help"),
        metrics_path="/prometheus/metrics",
    )


class TRTLLMAdapter(LaunchedAdapter):
    name = "trtllm"
    reference_help = REFERENCE_HELP
    kv_vocabulary = KVVocabulary("kv_dtype", KV_DTYPES, ("auto",))  # KvCacheConfig.dtype

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        values = settings_values(settings)
        if isinstance(values.get("extra_options"), Mapping):
            values["extra_options"] = dict(values["extra_options"])
        self.settings = build(TRTLLMSettings, values, "engine.trtllm")
        self.port = self.settings.port or free_port()
        self.model = resolve_model(self.settings.model)
        plan = trtllm_plan(self.settings, self.model, self.port, workdir)
        self.server = LaunchedServer(plan, workdir, self.port, check_flags=self.settings.check_flags)

    @property
    def served_model(self) -> str:
        return served_model_name(self.model)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            token_id_prompts=True,
            cached_token_reporting=True,
            output_token_ids=False,
            cache_reset=self.settings.restart_to_reset,
        )

    def describe(self) -> Mapping[str, object]:
        s = self.settings
        return {
            "kv_dtype": s.kv_dtype,
            "model": s.model,
            "block_reuse": s.block_reuse,
            "host_cache_gib": s.host_cache_gib,
            "tp_size": s.tp_size,
            "engine_version": self._version,
            "written_against": WRITTEN_AGAINST,
        }

    def engine_version(self) -> str | None:
        return installed_version(_python_of(self.settings.executable), ("tensorrt_llm", "tensorrt-llm"))

    def reset_cache(self) -> bool:
        """No reset endpoint: with restart_to_reset the server is restarted (minutes), else False."""
        if not self.settings.restart_to_reset:
            return False
        self.server.stop()
        self.server.start()
        self.server.wait_healthy(self.settings.health_timeout_s)
        return self.verify_cold(self.settings.max_seq_len)


def served_model_name(model: str) -> str:
    """The name trtllm-serve answers to: a local directory's basename, else MODEL as given (an HF name)."""
    path = Path(model)
    return path.name if path.is_dir() else model


def _python_of(executable: str) -> str:
    """The interpreter next to a console script (its venv's python), else `python3`."""
    import shutil

    found = shutil.which(executable)
    if found:
        sibling = Path(found).parent / "python"
        if sibling.exists():
            return str(sibling)
    return "python3"
