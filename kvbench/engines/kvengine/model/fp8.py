"""KV storage formats and their codecs: how a K or V vector becomes stored bytes and back.

Formats (`KVFormat`):

    kv_dtype   scale_mode  stored per token, per layer, per K and V
    fp32/bf16/fp16  none   H*D values in that dtype
    fp8_e4m3/e5m2   tensor H*D fp8 values; one static fp32 scale per layer (K and V apart)
    fp8_e4m3/e5m2   channel H*D fp8 values + H bf16 shifts; a static fp32 scale per (kv head, channel)

Channel mode encodes   q = fp8((x - shift_t) / scale_c)   and decodes   x' = q * scale_c + shift_t.
The per-token shift is the mean over the head's channels weighted by 1 / scale_c^2: the shift that minimises
the residual's energy in the quantized domain. It removes a token's common offset (an attention-sink token,
a V row with a large mean) while the few outlier channels, whose scales are large, barely move it (a plain
mean would be dragged by them; a median is robust too but ~100x slower on CPU). The shift is rounded to its
stored dtype *before* the residual is computed, so its rounding cancels on decode.

Scales are static: calibrated once per engine from a fixed forward pass (see `calibration.py`), never per
write, because pages are shared between requests and written at different times: one scale per layer means
a page decodes the same for every reader. Values beyond the calibrated range saturate at the format's max
(a plain cast would give NaN for e4m3fn and inf for e5m2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
UNQUANTIZED_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KV_DTYPES = tuple(UNQUANTIZED_DTYPES) + tuple(FP8_DTYPES)
SCALE_MODES = ("tensor", "channel")
SHIFT_DTYPE = torch.bfloat16  # range of fp32 (K/V outliers can pass fp16's 65504); rounding cancels anyway
DEFAULT_MARGIN = 2.0  # headroom over the calibrated amax for values the calibration pass did not see
_MIN_AMAX = 1e-6  # an all-zero calibration channel still gets a usable, finite scale


@dataclass(frozen=True)
class KVFormat:
    """How the KV cache stores values: a dtype name and a scale mode ('none' for unquantized dtypes)."""

    kv_dtype: str
    scale_mode: str

    @classmethod
    def parse(cls, kv_dtype: str, scale_mode: str | None = None) -> KVFormat:
        """Validate names; `scale_mode=None` means 'tensor' for fp8 and 'none' otherwise."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype={kv_dtype!r} is unknown; use one of {KV_DTYPES}")
        if kv_dtype in UNQUANTIZED_DTYPES:
            if scale_mode not in (None, "none"):
                raise ValueError(
                    f"scale_mode={scale_mode!r} applies to fp8 kv dtypes only; use scale_mode='none' "
                    f"(or None) with kv_dtype={kv_dtype!r}"
                )
            return cls(kv_dtype, "none")
        scale_mode = scale_mode or "tensor"
        if scale_mode not in SCALE_MODES:
            raise ValueError(f"scale_mode={scale_mode!r} is unknown for {kv_dtype}; use one of {SCALE_MODES}")
        return cls(kv_dtype, scale_mode)

    @property
    def storage_dtype(self) -> torch.dtype:
        return FP8_DTYPES.get(self.kv_dtype) or UNQUANTIZED_DTYPES[self.kv_dtype]

    @property
    def quantized(self) -> bool:
        return self.kv_dtype in FP8_DTYPES

    @property
    def shifted(self) -> bool:
        """Whether each token stores a shift per kv head beside its values."""
        return self.scale_mode == "channel"

    def scale_shape(self, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """Shape of one layer's K (or V) scale: () per tensor, (H, D) per channel."""
        return (num_kv_heads, head_dim) if self.scale_mode == "channel" else ()


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def scale_from_amax(amax: torch.Tensor, dtype: torch.dtype, margin: float = DEFAULT_MARGIN) -> torch.Tensor:
    """Scale so that `amax * margin` maps onto the fp8 format's largest value."""
    if margin < 1.0:
        raise ValueError(f"margin={margin} must be >= 1 (it is headroom over the calibrated amax)")
    return amax.float().clamp_min(_MIN_AMAX) * (margin / fp8_max(dtype))


def token_shift(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-token shift of `x [..., H, D]` given channel scales [H, D], rounded to `SHIFT_DTYPE`."""
    weight = scale.float().pow(-2)
    weight = weight / weight.sum(-1, keepdim=True)
    return (x.float() * weight).sum(-1).to(SHIFT_DTYPE)


def calibrate_scale(fmt: KVFormat, x: torch.Tensor, margin: float = DEFAULT_MARGIN) -> torch.Tensor:
    """Static scale for one layer's K (or V) from calibration values `x [T, H, D]`.

    tensor: amax over everything. channel: amax per (head, channel) of the shifted residual; the shift needs
    scales, so a first pass takes them from the raw per-channel amax.
    """
    if not fmt.quantized:
        raise ValueError(f"{fmt.kv_dtype} is not quantized: it has no scale to calibrate")
    x = x.float()
    if not fmt.shifted:
        return scale_from_amax(x.abs().amax(), fmt.storage_dtype, margin)
    first = scale_from_amax(x.abs().amax(dim=0), fmt.storage_dtype, margin)
    residual = x - token_shift(x, first).float().unsqueeze(-1)
    return scale_from_amax(residual.abs().amax(dim=0), fmt.storage_dtype, margin)


def encode(fmt: KVFormat, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Encode `x [T, H, D]` into (payload [T, H, D] in the storage dtype, shift [T, H] or None).

    `scale` is one layer's scale: shape () for tensor mode, (H, D) for channel mode; unused when unquantized.
    """
    if not fmt.quantized:
        return x.to(fmt.storage_dtype), None
    limit = fp8_max(fmt.storage_dtype)
    x = x.float()
    shift = None
    if fmt.shifted:
        shift = token_shift(x, scale)
        x = x - shift.float().unsqueeze(-1)
    payload = (x / scale).clamp_(-limit, limit).to(fmt.storage_dtype)
    return payload, shift


def decode(
    fmt: KVFormat,
    payload: torch.Tensor,
    shift: torch.Tensor | None,
    scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Inverse of `encode`: payload [..., H, D] (+ shift [..., H]) -> values in `out_dtype`."""
    if not fmt.quantized:
        return payload.to(out_dtype)
    out = payload.to(out_dtype).mul_(scale.to(out_dtype))
    if shift is not None:
        out.add_(shift.to(out_dtype).unsqueeze(-1))
    return out
