"""KV settings under evaluation: a KV dtype and, for FP8, a scale mode; and the unquantized baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.engines.kvengine.model.fp8 import FP8_DTYPES, KV_DTYPES, SCALE_MODES, UNQUANTIZED_DTYPES
from kvbench.settings import SettingsError

DEFAULT_DTYPES = ("fp32", "fp16", "fp8_e4m3", "fp8_e5m2")
DEFAULT_SCALES = SCALE_MODES  # tensor, channel (per-channel scale + per-token shift)


@dataclass(frozen=True)
class KVSetting:
    """One KV storage setting. `label` is how tables and eval.json name it: "fp32", "fp8_e4m3/channel"."""

    kv_dtype: str
    kv_scale: str = "tensor"

    @property
    def quantized(self) -> bool:
        return self.kv_dtype in FP8_DTYPES

    @property
    def label(self) -> str:
        return f"{self.kv_dtype}/{self.kv_scale}" if self.quantized else self.kv_dtype


def kv_settings(dtypes: Sequence[str], scales: Sequence[str]) -> tuple[KVSetting, ...]:
    """Every dtype with every scale for FP8 (one setting per unquantized dtype), in the order given.

    The first unquantized dtype is the baseline; without one there is nothing to take deltas against.
    """
    for name, values, valid in (("kv_dtype", dtypes, KV_DTYPES), ("kv_scale", scales, SCALE_MODES)):
        bad = [value for value in values if value not in valid]
        if bad or not values:
            raise SettingsError(f"{name}: {', '.join(bad) or 'empty list'} not valid; use some of {', '.join(valid)}")
    if not any(dtype in UNQUANTIZED_DTYPES for dtype in dtypes):
        raise SettingsError(
            f"kv_dtype: {', '.join(dtypes)} has no unquantized baseline; add one of {', '.join(UNQUANTIZED_DTYPES)} "
            "(fp32 first, normally)"
        )
    out: list[KVSetting] = []
    for dtype in dict.fromkeys(dtypes):
        if dtype in FP8_DTYPES:
            out += [KVSetting(dtype, scale) for scale in dict.fromkeys(scales)]
        else:
            out.append(KVSetting(dtype))
    return tuple(out)


def baseline_of(settings: Sequence[KVSetting]) -> KVSetting:
    """The first unquantized setting."""
    return next(setting for setting in settings if not setting.quantized)
