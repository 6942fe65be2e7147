"""KV storage formats by name: the one list of KV dtypes our engine stores, their scale modes and the default.

    kv_dtype    bytes/element  quantized  scale modes
    fp32        4              no         none
    bf16        2              no         none
    fp16        2              no         none
    fp8_e5m2    1              yes        tensor (default), channel
    fp8_e4m3    1              yes        tensor (default), channel

A `KVFormat` is a dtype and its scale mode, parsed once from the names users write (YAML, flags) and passed
as a value from there on. Torch-free: the model maps it to torch dtypes (`model/fp8.py`), the simulator's
geometry builds its wider table of names other engines use on `KVDtype` (`sim/geometry.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class KVDtype(StrEnum):
    """A KV storage dtype, by the name users write; it knows its size and whether it is quantized (scaled)."""

    FP32 = "fp32", 4, False
    BF16 = "bf16", 2, False
    FP16 = "fp16", 2, False
    FP8_E5M2 = "fp8_e5m2", 1, True
    FP8_E4M3 = "fp8_e4m3", 1, True

    bytes_per_element: int
    quantized: bool

    def __new__(cls, name: str, bytes_per_element: int, quantized: bool) -> KVDtype:
        member = str.__new__(cls, name)
        member._value_ = name
        member.bytes_per_element = bytes_per_element
        member.quantized = quantized
        return member


class ScaleMode(StrEnum):
    """How a quantized dtype is scaled: one static scale per layer (tensor), or per (kv head, channel) with a
    per-token shift (channel). Unquantized dtypes have none."""

    NONE = "none"
    TENSOR = "tensor"
    CHANNEL = "channel"


KV_DTYPES: tuple[str, ...] = tuple(dtype.value for dtype in KVDtype)  # the names, in the order messages list them
SCALE_MODES: tuple[str, ...] = (ScaleMode.TENSOR.value, ScaleMode.CHANNEL.value)  # the modes of a quantized dtype
DEFAULT_KV_DTYPE = KVDtype.FP32
DEFAULT_SCALE_MODE = ScaleMode.TENSOR  # what a quantized dtype uses when no mode is named


@dataclass(frozen=True, slots=True, repr=False)
class KVFormat:
    """How the KV cache stores values: a dtype and its scale mode (`NONE` exactly for unquantized dtypes)."""

    kv_dtype: KVDtype
    scale_mode: ScaleMode = ScaleMode.NONE

    def __post_init__(self) -> None:
        if self.kv_dtype.quantized == (self.scale_mode == ScaleMode.NONE):
            raise ValueError(
                f"scale_mode={self.scale_mode.value!r} does not fit kv_dtype={self.kv_dtype.value!r}; "
                f"use {'one of ' + ', '.join(SCALE_MODES) if self.kv_dtype.quantized else 'none'}"
            )

    @classmethod
    def parse(cls, kv_dtype: str, scale_mode: str | None = None) -> KVFormat:
        """Validate names; `scale_mode=None` means the default mode for fp8 and 'none' otherwise."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype={kv_dtype!r} is unknown; use one of {', '.join(KV_DTYPES)}")
        dtype = KVDtype(kv_dtype)
        if not dtype.quantized:
            if scale_mode not in (None, ScaleMode.NONE):
                raise ValueError(
                    f"scale_mode={scale_mode!r} applies to fp8 kv dtypes only; use scale_mode='none' "
                    f"(or None) with kv_dtype={kv_dtype!r}"
                )
            return cls(dtype)
        scale_mode = scale_mode or DEFAULT_SCALE_MODE
        if scale_mode not in SCALE_MODES:
            raise ValueError(
                f"scale_mode={scale_mode!r} is unknown for {kv_dtype}; use one of {', '.join(SCALE_MODES)}"
            )
        return cls(dtype, ScaleMode(scale_mode))

    @classmethod
    def from_settings(cls, kv_dtype: str, kv_scale: str) -> KVFormat:
        """The format a `kv_dtype` / `kv_scale` pair of settings names: `kv_scale` applies to quantized dtypes
        only (an unquantized dtype ignores it, so its default needs no change when kv_dtype does)."""
        quantized = kv_dtype in KV_DTYPES and KVDtype(kv_dtype).quantized
        return cls.parse(kv_dtype, kv_scale if quantized else None)

    @property
    def quantized(self) -> bool:
        return self.kv_dtype.quantized

    @property
    def shifted(self) -> bool:
        """Whether each token stores a shift per kv head beside its values."""
        return self.scale_mode == ScaleMode.CHANNEL

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one stored K or V value (a shift, in channel mode, comes on top: see `PagedKVCache`)."""
        return self.kv_dtype.bytes_per_element

    @property
    def label(self) -> str:
        """How tables and run descriptions name it: `fp32`, `fp8_e4m3/channel`."""
        return f"{self.kv_dtype}/{self.scale_mode}" if self.quantized else str(self.kv_dtype)

    def scale_shape(self, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """Shape of one layer's K (or V) scale: () per tensor, (H, D) per channel."""
        return (num_kv_heads, head_dim) if self.scale_mode == ScaleMode.CHANNEL else ()

    def __repr__(self) -> str:  # plain names: part of the KV layout fingerprint that lower tiers store
        return f"KVFormat(kv_dtype={self.kv_dtype.value!r}, scale_mode={self.scale_mode.value!r})"


DEFAULT_KV_FORMAT = KVFormat(DEFAULT_KV_DTYPE)
