"""The engine adapter contract: how kvbench starts, probes, resets, scrapes and stops an engine.

An adapter is built from its settings (a mapping from YAML or flags) and a folder for its files (log,
generated configs). The runner calls, in order: `start()` (launch, or nothing for an engine someone else
runs), `wait_healthy(timeout_s)`, then per measured run `reset_cache()` and `scrape_metrics()` before and after
the load, and finally `stop()`. Adapters register under the entry-point group `kvbench.engines`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

ENTRY_POINT_GROUP = "kvbench.engines"


class EngineError(RuntimeError):
    """The engine could not be started, reached or stopped; the message says why (with its log tail)."""


@dataclass(frozen=True)
class Capabilities:
    """What the engine's API can do; the harness adapts (and the report says what was unavailable)."""

    token_id_prompts: bool = True
    cached_token_reporting: bool = True
    output_token_ids: bool = False
    cache_reset: bool = False
    prompt_logprobs: bool = False
    # What the prefix cache shares across tenants, which the oracle of reusable tokens follows: our engine's
    # `strict` | `shared-prefix` (then only `shared_prefixes`, texts or token ids), or `shared-all` (vLLM,
    # SGLang, any server that reuses every tenant's prefixes).
    isolation: str = "shared-all"
    shared_prefixes: tuple[str | tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class KVVocabulary:
    """How an adapter names KV storage for `kvbench eval`: the setting `setting` takes one of `dtypes` (the engine's
    own names, e.g. vLLM's --kv-cache-dtype values); `unquantized` store the model's own precision (a baseline)."""

    setting: str
    dtypes: tuple[str, ...]
    unquantized: tuple[str, ...]

    def quantized(self, dtype: str) -> bool:
        return dtype not in self.unquantized


@dataclass(frozen=True)
class Endpoint:
    """Where the engine answers: an OpenAI-compatible base URL (no /v1), the model name, an optional key."""

    base_url: str
    model: str
    api_key: str | None = None


class EngineAdapter(Protocol):
    """One engine, configured. Implementations keep their state to themselves."""

    name: str

    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def describe(self) -> Mapping[str, object]:
        """Settings that identify this engine configuration in result tables (e.g. `kv_dtype`)."""
        ...

    def start(self) -> None: ...

    def wait_healthy(self, timeout_s: float) -> None:
        """Return when the engine answers, else raise EngineError with the reason (and log tail)."""
        ...

    def reset_cache(self) -> bool:
        """Drop the engine's prefix cache; False when the engine offers no way to."""
        ...

    def scrape_metrics(self) -> Mapping[str, float] | None:
        """Current Prometheus samples as {'name{label="v",...}': value}, or None when there is no /metrics."""
        ...

    def stop(self) -> None: ...


class AdapterFactory(Protocol):
    def __call__(self, settings: Mapping[str, object], workdir: Path) -> EngineAdapter: ...
