"""Our engine's settings: the one definition of each, from a YAML key to the step loop.

Every field of `EngineConfig` carries its name, type, default, help and, where it has them, its unit, range
and choices (`setting`). Everything else is derived from it, never listed again:

    YAML / --set key    engine.kvengine.<field>         build(EngineConfig, mapping, where)  (the adapter)
    kvbench serve flag  --<field with dashes>           flags.add_flags / flags.from_args
    the child's argv    the adapter's command()         flags.to_argv
    the step loop       Engine(config)                  runtime/engine.py
    the simulator       sim_config_for_engine(config)   sim/validate.py

`ServeOptions` are the server process's own flags (listen address, keys, step log), not the engine's.
Vocabularies are values: `IsolationMode` here, the KV format in `core.kv_format`. Torch-free: the adapter and
the CLI import this without loading a model.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Literal

from kvbench.engines.kvengine.core.kv_format import (
    DEFAULT_KV_DTYPE,
    DEFAULT_SCALE_MODE,
    SCALE_MODES,
    KVDtype,
    KVFormat,
    ScaleMode,
)
from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.engines.kvengine.core.tiers import DEFAULT_TIER_INTERVAL_S, DEFAULT_TTL
from kvbench.settings import Bounds, check_bounds

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")  # torch dtype names (runtime/engine.py maps them)
ADMIN_KEY_ENV = "KVENGINE_ADMIN_KEY"  # an environment variable keeps the admin key out of argv (ps, logs)
TIER_SECRET_ENV = "KVENGINE_TIER_SECRET"  # the lower tiers' record secret, kept out of argv the same way
AUTO = "auto"  # kv_capacity: what fits in memory (runtime/memory_budget.py); max_prefill_beside_decodes: timed
DEFAULT_PORT = 8000
# A step with running decodes may take this many times a pure decode step (max_prefill_beside_decodes auto).
# Chosen on `benchmarks/engine_vs_vllm.py` (512-token prompts, 64 out, concurrency 4, SmolLM2-135M fp32, 2 AVX2
# cores; resolved budget -> TTFT p50 ms / ITL p50 / ITL p99 / out tok/s): factor 2 -> 19 tokens, 7,936 / 177 /
# 332 / 11.3; 3 -> 30, 3,526 / 164 / 237 / 18.2; 4 -> 57, 2,802 / 140 / 353 / 17.1; a fixed 128 (the default
# before) 2,315 / 121 / 544 / 18.3. 3 keeps ITL p99 within 2x p50 at 128's throughput; its TTFT is 1.5x 128's.
# Again on 2 AVX-512 cores (rounds alternated, budget, TTFT p50 / TPOT p50 / ITL p50 / p99 / tok/s): 3 -> 39, 1,630
# / 86.9 / 98.1 / 166.4 / 32.7 and 38, 1,598 / 86.3 / 97.4 / 134.4 / 34.9; 2 -> 21, 3,061 / 84.3 / 84.3 / 125.3 /
# 28.1 and 23, 2,282 / 87.3 / 86.1 / 104.0 / 30.5: the same TPOT for more TTFT and less throughput, so 3 stays
# (only 2 bounds ITL p99 by 2x p50 whichever kind of step the median falls on; 3 did in 4 of 5 runs).
# On a GPU, where a decode step reads the weights once whatever its width, it resolves to the step budget.
DEFAULT_DECODE_STALL_FACTOR = 3.0
PORT_RANGE = {"ge": 1, "le": 65535}  # of `kvbench serve --port`, and of the adapter's port setting


class IsolationMode(StrEnum):
    """What tenants may share in the prefix cache."""

    STRICT = "strict"  # nothing: every tenant's pages live in a namespace of its own
    SHARED_PREFIX = "shared-prefix"  # the tenants file's shared_prefixes (a system prompt), nothing else


def setting(
    default: Any,
    help: str,
    *,
    unit: str = "",
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    choices: tuple[str, ...] | None = None,
    repr: bool = True,
    flag: bool = True,
) -> Any:
    """A settings field: its default, its help (a flag's), its unit and range (`settings.build` enforces
    them, and so does the config itself) and, for a string, its choices (an enum field's are its values).
    `repr=False` keeps a secret out of the config's repr (and so out of logs); `flag=False` keeps it off the
    command line (argv is in /proc/PID/cmdline and `ps` for every user of the machine)."""
    metadata = {"bounds": Bounds(gt, ge, le, unit), "help": help, "choices": choices, "flag": flag}
    return field(default=default, repr=repr, metadata=metadata)


def choices_of(f: dataclasses.Field, hint: Any) -> tuple[str, ...] | None:
    """The values a field accepts by name: its declared choices, else its enum's values, else None (any)."""
    if f.metadata.get("choices"):
        return f.metadata["choices"]
    if isinstance(hint, type) and issubclass(hint, Enum):
        return tuple(member.value for member in hint)
    return None


def check_fields(config: object) -> None:
    """Check every field of a settings dataclass against its range and choices, and turn the names of an
    enum field into its value (frozen dataclasses: through object.__setattr__). ValueError names the field."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        value, hint = getattr(config, f.name), hints[f.name]
        choices = choices_of(f, hint)
        if choices is not None and value not in choices:
            raise ValueError(f"{f.name} {value!r} is not one of {', '.join(choices)}")
        if isinstance(hint, type) and issubclass(hint, Enum):
            object.__setattr__(config, f.name, hint(value))
        if "bounds" in f.metadata:
            check_bounds(value, f.metadata["bounds"], f.name)


@dataclass(frozen=True)
class EngineConfig:
    """How our engine runs. The device KV tier is `kv_capacity` tokens, or `kv_capacity_bytes` when given
    (then the token count follows the KV format: FP8 holds twice the tokens of bf16 in the same bytes).
    `kv_format` is `kv_dtype` + `kv_scale` parsed once, here; the model receives it."""

    model: str = setting(
        "default", "'default' (SmolLM2-135M-Instruct), a .gguf file, a safetensors folder, or 'tiny-random' (tests)"
    )
    kv_dtype: KVDtype = setting(DEFAULT_KV_DTYPE, "KV cache storage dtype")
    kv_scale: ScaleMode = setting(
        DEFAULT_SCALE_MODE,
        "fp8 scales: per tensor, or per channel + per-token shift (fp8 dtypes only; others ignore it)",
        choices=SCALE_MODES,
    )
    kv_capacity: int | Literal["auto"] = setting(
        32768,
        f"device KV tier ('{AUTO}': what fits in memory_utilization "
        "of the free device memory once weights and activations are "
        "counted)",
        unit="tokens",
        ge=1,
    )
    kv_capacity_bytes: int | None = setting(
        None, "device KV tier in bytes, per device (overrides kv_capacity)", unit="bytes", ge=1
    )
    memory_utilization: float = setting(
        0.9,
        "fraction of the free device memory at start (host RAM on cpu) that "
        "weights, KV and activations may fill (vLLM's gpu_memory_utilization)",
        gt=0,
        le=1,
    )
    page_size: int = setting(DEFAULT_PAGE_SIZE, "tokens per KV page", unit="tokens", ge=1)
    max_num_seqs: int = setting(16, "sequences running at once", ge=1)
    max_step_tokens: int = setting(512, "token budget of one step (chunked prefill)", unit="tokens", ge=1)
    max_prefill_beside_decodes: int | Literal["auto"] = setting(
        AUTO,
        "prefill tokens a step computes beside running decodes (decodes go first; a step without decodes "
        f"prefills up to max_step_tokens; '{AUTO}': timed at start, the most that keeps such a step within "
        "decode_stall_factor of a pure decode step)",
        unit="tokens",
        ge=1,
    )
    decode_stall_factor: float = setting(
        DEFAULT_DECODE_STALL_FACTOR,
        f"with max_prefill_beside_decodes '{AUTO}': how many times a pure decode "
        "step a step with prefill beside its decodes may take (the bound on ITL p99 / p50 under new prompts)",
        gt=1,
    )
    prefix_caching: bool = setting(True, "reuse cached prompt prefixes")
    device: str = setting(
        "cpu", "torch device of the model and the device KV tier (with several ranks, `cuda` is cuda:0 .. cuda:N-1)"
    )
    tensor_parallel_size: int = setting(
        1,
        "ranks the model is split over (attention heads, MLP, vocabulary), one "
        "process and device each; nccl on cuda, shared memory + gloo on cpu",
        ge=1,
    )
    compute_dtype: str = setting("float32", "dtype of weights and activations", choices=COMPUTE_DTYPES)
    max_model_len: int | None = setting(None, "context length (default: the model's)", unit="tokens", ge=1)
    served_model_name: str | None = setting(None, "model name in the API (default: the model folder's name)")
    threads: int | None = setting(
        None, "torch threads, set by `kvbench serve` (default: all cores, with a passive OpenMP wait)", ge=1
    )
    prepacked_weights: bool = setting(
        True,
        "on cpu with float32 weights, keep oneDNN-prepacked copies of the "
        "linear weights for steps of more than one token (batch 4-8 decodes: 14-24% "
        "less CPU time; one more copy of those weights, counted in the memory budget)",
    )
    cuda_graphs: bool = setting(
        False,
        "replay decode steps as CUDA graphs, one per batch-size and context bucket, "
        "captured on first use (needs a cuda device; refused on others)",
    )
    # Lower tiers (0 / None: not used), in tokens like kv_capacity.
    host_capacity: int = setting(0, "host-memory KV tier (0: none)", unit="tokens", ge=0)
    disk_capacity: int = setting(0, "disk KV tier (0: none; needs disk_dir)", unit="tokens", ge=0)
    disk_dir: str | None = setting(None, "directory of the disk tier's page files")
    remote_url: str | None = setting(
        None,
        "shared Redis KV tier, e.g. redis://127.0.0.1:6379/0 (shared by every engine of the same model and KV format)",
    )
    # Neither in repr (a logged config never shows it) nor a flag (argv is public on the machine): YAML, the
    # environment ($KVENGINE_TIER_SECRET) or tier_secret_file.
    tier_secret: str | None = setting(
        None,
        f"secret of the HMAC-SHA256 that authenticates disk and remote tier "
        f"records (default: ${TIER_SECRET_ENV}); one per shared store: an engine "
        "with another secret misses every record",
        repr=False,
        flag=False,
    )
    tier_secret_file: str | None = setting(
        None,
        "a file whose first line is the tier secret (instead of "
        f"${TIER_SECRET_ENV}; the secret itself is never a flag)",
    )
    device_ttl_s: float = setting(
        DEFAULT_TTL.device_s, "idle seconds before a page leaves device (tenants may set their own)", unit="s", gt=0
    )
    host_ttl_s: float = setting(DEFAULT_TTL.host_s, "idle seconds before a page leaves host memory", unit="s", gt=0)
    tier_interval_s: float = setting(
        DEFAULT_TIER_INTERVAL_S, "engine seconds between tier placement passes (0: every step)", unit="s", ge=0
    )
    # Tenants: API keys, quotas, reservations and TTLs from a file; isolation across tenants.
    tenants_file: str | None = setting(None, "YAML/JSON: API keys -> tenants, quotas, reservations, TTLs")
    isolation: IsolationMode = setting(
        IsolationMode.STRICT,
        "strict: no page shared across tenants; "
        "shared-prefix: the tenants file's shared_prefixes (e.g. a system prompt) "
        "are shared, nothing else",
    )
    kv_format: KVFormat = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "kv_format", KVFormat.from_settings(self.kv_dtype, self.kv_scale))
        for name in ("kv_capacity", "max_prefill_beside_decodes"):
            value = getattr(self, name)
            if value != AUTO and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{name} {value!r} must be a number of tokens or '{AUTO}'")
        if isinstance(self.kv_capacity, int) and self.kv_capacity < self.page_size:
            raise ValueError(f"kv_capacity ({self.kv_capacity}) must hold at least one page of {self.page_size} tokens")
        if self.cuda_graphs and not self.device.startswith("cuda"):
            raise ValueError(
                f"cuda_graphs needs a cuda device, but device is {self.device!r}: set device=cuda "
                "or leave cuda_graphs off"
            )
        if self.disk_capacity and not self.disk_dir:
            raise ValueError("disk_capacity > 0 needs disk_dir, a directory for the disk tier's page files")
        if self.device_ttl_s > self.host_ttl_s:
            raise ValueError(
                f"device_ttl_s ({self.device_ttl_s:g}) must be <= host_ttl_s ({self.host_ttl_s:g}): "
                "a page leaves device before it leaves host"
            )


@dataclass(frozen=True)
class ServeOptions:
    """The server process's own flags: where it listens, which keys it accepts, where it logs steps."""

    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(DEFAULT_PORT, "port to listen on", **PORT_RANGE)
    api_key: str | None = setting(
        None, "require this Bearer key (tenant 'default'; it administers too unless --admin-key is given)"
    )
    # No default from the environment here: --help would show the key.
    admin_key: str | None = setting(
        None,
        f"the Bearer key of /reset_prefix_cache and /metrics (default: "
        f"${ADMIN_KEY_ENV}, else --api-key); with any key configured, those "
        "endpoints need it",
    )
    metrics_open: bool = setting(False, "serve /metrics without a key (a Prometheus that sends none)")
    stall_timeout_s: float = setting(
        5.0,
        "a streaming client that reads nothing for this long (its socket full; "
        "its request parked meanwhile, holding no slot) is ended: its request "
        "aborted (kvbench:client_stalled_total)",
        unit="s",
        gt=0,
    )
    step_log: str | None = setting(
        None, "append every model step's token ranges and seconds to this JSONL file (for `kvbench calibrate --steps`)"
    )

    def __post_init__(self) -> None:
        check_fields(self)
