"""KV settings under evaluation: a KV dtype and, for FP8, a scale mode; and the unquantized baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvbench.engines.kvengine.core.kv_format import DEFAULT_SCALE_MODE, KV_DTYPES, SCALE_MODES, KVDtype, KVFormat
from kvbench.settings import SettingsError

DEFAULT_DTYPES = tuple(d.value for d in (KVDtype.FP32, KVDtype.FP16, KVDtype.FP8_E4M3, KVDtype.FP8_E5M2))
DEFAULT_SCALES = SCALE_MODES  # tensor, channel (per-channel scale + per-token shift)
UNQUANTIZED_DTYPES = tuple(dtype.value for dtype in KVDtype if not dtype.quantized)


@dataclass(frozen=True)
class KVSetting:
    """One KV storage setting, by the names eval.json uses; `kv_format` is them parsed (once, here).
    `label` is how tables and eval.json name it: "fp32", "fp8_e4m3/channel"."""

    kv_dtype: str
    kv_scale: str = DEFAULT_SCALE_MODE.value
    kv_format: KVFormat = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_format", KVFormat.from_settings(self.kv_dtype, self.kv_scale))

    @property
    def quantized(self) -> bool:
        return self.kv_format.quantized

    @property
    def label(self) -> str:
        return self.kv_format.label


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
        if KVDtype(dtype).quantized:
            out += [KVSetting(dtype, scale) for scale in dict.fromkeys(scales)]
        else:
            out.append(KVSetting(dtype))
    return tuple(out)


def baseline_of(settings: Sequence[KVSetting]) -> KVSetting:
    """The first unquantized setting."""
    return next(setting for setting in settings if not setting.quantized)
