"""The device KV capacity an engine states about itself on /metrics, read from a scrape.

Each engine names it its own way: ours `kvbench:kv_capacity_tokens` and `kvbench:kv_capacity_bytes` (the tier
as allocated, per device); vLLM `vllm:cache_config_info`, an info gauge whose labels hold `kv_cache_size_tokens` in
recent versions, else `num_gpu_blocks` and `block_size` (tokens = their product; it states no bytes); SGLang `sglang:max_total_num_tokens`. A value is
per engine replica: where several ranks or replicas report one, the largest is kept. An engine that states
none gives None (missing, never the configured setting, which may not be what the engine allocated). Our
engine's resolved prefill budget beside decodes is read here too (`stated_prefill_budget`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class KVCapacity:
    tokens: int
    bytes: int | None  # None: the engine does not state it
    source: str  # the metric it was read from

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "bytes": self.bytes, "source": self.source}


def kv_capacity(samples: Mapping[str, float] | None) -> KVCapacity | None:
    """The capacity stated in `samples` (`prometheus.parse_samples` form), or None."""
    if not samples:
        return None
    tokens = _largest(samples, "kvbench:kv_capacity_tokens")
    if tokens is not None:
        return KVCapacity(tokens, _largest(samples, "kvbench:kv_capacity_bytes"), "kvbench:kv_capacity_tokens")
    blocks = [_vllm_tokens(key) for key in samples if key.split("{", 1)[0] == "vllm:cache_config_info"]
    blocks = [count for count in blocks if count is not None]
    if blocks:
        return KVCapacity(max(blocks), None, "vllm:cache_config_info")
    tokens = _largest(samples, "sglang:max_total_num_tokens")
    if tokens is not None:
        return KVCapacity(tokens, None, "sglang:max_total_num_tokens")
    return None


def stated_prefill_budget(samples: Mapping[str, float] | None) -> int | None:
    """Our engine's prefill tokens beside running decodes as it resolved them (`kvbench:prefill_beside_decodes_tokens`,
    which `auto` times at start), or None where the engine states none."""
    return _largest(samples, "kvbench:prefill_beside_decodes_tokens") if samples else None


def _largest(samples: Mapping[str, float], name: str) -> int | None:
    values = [
        value for key, value in samples.items() if key.split("{", 1)[0] == name and math.isfinite(value) and value > 0
    ]
    return int(max(values)) if values else None


def _vllm_tokens(key: str) -> int | None:
    """vLLM's own figure (`kv_cache_size_tokens`, the "KV cache size: N tokens" of its log) where its version
    has one, else num_gpu_blocks x block_size."""
    labels = dict(_LABEL.findall(key.partition("{")[2]))
    stated = labels.get("kv_cache_size_tokens", "")
    if stated.isdigit() and int(stated) > 0:
        return int(stated)
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() and int(blocks) > 0 else None
