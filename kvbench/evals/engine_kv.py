"""Which KV settings `kvbench eval` runs, for our engine or for another engine by its own names.

Our engine keeps its formats (`kv_settings.KVSetting`: fp32/fp16/bf16, fp8 with a scale mode). Every other engine
is asked through its adapter's `kv_vocabulary` (vLLM and SGLang `kv_cache_dtype: auto|fp8_e4m3|fp8_e5m2`,
TensorRT-LLM `kv_dtype: auto|fp8|nvfp4` for KvCacheConfig.dtype): the adapter owns the names, this module only
picks the ones asked for and checks there is an unquantized baseline. Scale modes are our engine's; the others
choose their own scales, so `kv_scale` does not apply to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.engines.base import KVVocabulary
from kvbench.evals.kv_settings import DEFAULT_DTYPES, KVSetting, kv_settings
from kvbench.settings import SettingsError

IN_PROCESS_ENGINES = ("kvengine",)


@dataclass(frozen=True)
class EngineKVSetting:
    """One KV dtype of another engine, by that engine's name for it; `label` is how eval tables name it."""

    kv_dtype: str
    setting: str
    quantized: bool

    @property
    def label(self) -> str:
        return self.kv_dtype

    def adapter_values(self) -> dict[str, object]:
        return {self.setting: self.kv_dtype}


def kvengine_values(setting: KVSetting) -> dict[str, object]:
    """Our adapter's settings for one of our KV formats."""
    values: dict[str, object] = {"kv_dtype": setting.kv_dtype}
    if setting.quantized:
        values["kv_scale"] = setting.kv_scale
    return values


def adapter_values(setting: KVSetting | EngineKVSetting) -> dict[str, object]:
    return setting.adapter_values() if isinstance(setting, EngineKVSetting) else kvengine_values(setting)


def vocabulary_of(engine: str) -> KVVocabulary:
    """The engine adapter's KV names; an adapter without them cannot be evaluated by KV setting."""
    from kvbench.engines.registry import engine_factory

    vocabulary = getattr(engine_factory(engine), "kv_vocabulary", None)
    if vocabulary is None:
        raise SettingsError(
            f"engine: {engine} has no KV settings kvbench eval can vary; use kvengine, vllm, sglang, lmcache or trtllm"
        )
    return vocabulary


def settings_for(engine: str, dtypes: Sequence[str], scales: Sequence[str]) -> tuple[KVSetting | EngineKVSetting, ...]:
    """The settings to evaluate, baseline first among the unquantized. For another engine, the default dtype list
    (ours) becomes its unquantized baseline and its fp8 ones (e.g. auto, fp8_e4m3, fp8_e5m2)."""
    if engine in IN_PROCESS_ENGINES:
        return kv_settings(dtypes, scales)
    vocabulary = vocabulary_of(engine)
    if tuple(dtypes) == DEFAULT_DTYPES:
        dtypes = (vocabulary.unquantized[0], *(d for d in ("fp8", "fp8_e4m3", "fp8_e5m2") if d in vocabulary.dtypes))
    bad = [dtype for dtype in dtypes if dtype not in vocabulary.dtypes]
    if bad or not dtypes:
        raise SettingsError(
            f"kv_dtype: {', '.join(bad) or 'empty list'} not valid for {engine}; use some of "
            f"{', '.join(vocabulary.dtypes)} ({engine}'s {vocabulary.setting})"
        )
    if not any(dtype in vocabulary.unquantized for dtype in dtypes):
        raise SettingsError(
            f"kv_dtype: {', '.join(dtypes)} has no unquantized baseline for {engine}; add "
            f"{' or '.join(vocabulary.unquantized)} (first, normally)"
        )
    return tuple(
        EngineKVSetting(dtype, vocabulary.setting, vocabulary.quantized(dtype)) for dtype in dict.fromkeys(dtypes)
    )
