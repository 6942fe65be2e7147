"""KV storage formats and their codecs: how a K or V vector becomes stored bytes and back.

Formats (`KVFormat`, named in `core.kv_format`):

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

On CPU the fp8 encode and decode (and the cache's scatter and gather of token rows) run as one C pass
(`cpu_kernels`) where it builds; the torch code here is the path everywhere else, and gives the same bits.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from functools import cache

import torch

from kvbench.engines.kvengine.core.kv_format import KVDtype, KVFormat
from kvbench.engines.kvengine.model import cpu_kernels

# The torch dtype of every KV dtype name (the names and their sizes are `core.kv_format`'s).
TORCH_DTYPES: Mapping[KVDtype, torch.dtype] = {
    KVDtype.FP32: torch.float32,
    KVDtype.BF16: torch.bfloat16,
    KVDtype.FP16: torch.float16,
    KVDtype.FP8_E5M2: torch.float8_e5m2,
    KVDtype.FP8_E4M3: torch.float8_e4m3fn,
}
SHIFT_DTYPE = torch.bfloat16  # range of fp32 (K/V outliers can pass fp16's 65504); rounding cancels anyway
DEFAULT_MARGIN = 2.0  # headroom over the calibrated amax for values the calibration pass did not see
_MIN_AMAX = 1e-6  # an all-zero calibration channel still gets a usable, finite scale


def storage_dtype(fmt: KVFormat) -> torch.dtype:
    """The torch dtype K and V values are stored in."""
    return TORCH_DTYPES[fmt.kv_dtype]


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


# Bit layout of each fp8 format: (exponent bits, mantissa bits, exponent bias, IEEE-style inf/NaN at the top
# exponent). e4m3fn ("fn": finite, NaN only) has no inf and one NaN pattern per sign (S.1111.111); e5m2 is the
# top byte of an IEEE fp16.
_FP8_BITS: Mapping[torch.dtype, tuple[int, int, int, bool]] = {
    torch.float8_e4m3fn: (4, 3, 7, False),
    torch.float8_e5m2: (5, 2, 15, True),
}


def fp8_code_value(code: int, dtype: torch.dtype) -> float:
    """The value of one fp8 byte `code` (0..255), from the format's definition (not through a torch cast)."""
    exp_bits, man_bits, bias, ieee = _FP8_BITS[dtype]
    sign = -1.0 if code & 0x80 else 1.0
    exponent = (code >> man_bits) & ((1 << exp_bits) - 1)
    mantissa = code & ((1 << man_bits) - 1)
    top = (1 << exp_bits) - 1
    if ieee and exponent == top:
        return sign * math.inf if mantissa == 0 else math.nan
    if not ieee and exponent == top and mantissa == (1 << man_bits) - 1:
        return math.nan
    if exponent == 0:  # subnormal
        return sign * math.ldexp(mantissa / (1 << man_bits), 1 - bias)
    return sign * math.ldexp(1 + mantissa / (1 << man_bits), exponent - bias)


@cache
def _decode_table_cpu(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([fp8_code_value(code, dtype) for code in range(256)], dtype=torch.float32)


@cache
def decode_table(dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 [256]: the value of every fp8 byte, indexed by the byte (`payload.view(torch.uint8)`); one shared
    tensor per (dtype, device), built once (callers read it, never write it).

    Decoding by table lookup (as llama.cpp does for its quants) is ~10x faster on CPU than torch's
    float8_e4m3fn -> float cast, and a table scaled once per layer folds the tensor scale into the lookup.
    """
    return _decode_table_cpu(dtype).to(device)


# From this many values on, `lut_decode` looks up two bytes at a time in a 65,536-entry table of value pairs
# (built per call, ~0.3 ms measured): half the lookups, which are what a bulk decode spends its time on (torch's
# index_select runs on one thread). Below it the 256-entry table, which stays in L1, is faster.
PAIR_DECODE_MIN = 1 << 20
_PAIR_VIEWS = {2: torch.int32, 4: torch.int64}  # a pair of table entries, as one index_select element
_PAIR_CODES = torch.arange(1 << 16, dtype=torch.int32)


def _pair_table(table: torch.Tensor) -> torch.Tensor:
    """[65536] of `_PAIR_VIEWS[itemsize]`: entry lo | hi << 8 holds (table[lo], table[hi]), which is what the
    two bytes lo, hi read as one little-endian int16 decode to."""
    codes = _PAIR_CODES.to(table.device)
    pairs = torch.stack((table[codes & 0xFF], table[codes >> 8]), dim=-1)
    return pairs.view(_PAIR_VIEWS[table.element_size()]).view(-1)


def lut_decode(codes: torch.Tensor, table: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`table[codes]` for uint8 `codes [...]` and a [256] table -> [...] in the table's dtype (into `out`)."""
    if out is None:
        out = torch.empty(codes.shape, dtype=table.dtype, device=table.device)
    n = codes.numel()
    if (
        n >= PAIR_DECODE_MIN
        and n % 2 == 0
        and codes.is_contiguous()
        and out.is_contiguous()
        and table.element_size() in _PAIR_VIEWS
        and sys.byteorder == "little"
        and codes.device.type == "cpu"
    ):
        index = codes.view(-1).view(torch.int16).to(torch.int32).bitwise_and_(0xFFFF)
        pairs = _pair_table(table)
        torch.index_select(pairs, 0, index, out=out.view(-1).view(pairs.dtype))
        return out
    torch.index_select(table, 0, codes.reshape(-1).to(torch.int32), out=out.view(-1))
    return out


def scale_from_amax(amax: torch.Tensor, dtype: torch.dtype, margin: float = DEFAULT_MARGIN) -> torch.Tensor:
    """Scale so that `amax * margin` maps onto the fp8 format's largest value."""
    if margin < 1.0:
        raise ValueError(f"margin={margin} must be >= 1 (it is headroom over the calibrated amax)")
    return amax.float().clamp_min(_MIN_AMAX) * (margin / fp8_max(dtype))


def shift_weights(scale: torch.Tensor) -> torch.Tensor:
    """[H, D] weights of a token's shift: 1 / scale^2, normalised over each head's channels."""
    weight = scale.float().pow(-2)
    return weight / weight.sum(-1, keepdim=True)


def pairwise_sum(p: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in one fixed order: element i plus element i + half, halving, an odd last element
    carried. `cpu_kernels` adds in the same order, so that both paths store the same shift bits."""
    while p.shape[-1] > 1:
        m = p.shape[-1]
        half = m // 2
        s = p[..., :half] + p[..., half : 2 * half]
        p = torch.cat((s, p[..., 2 * half :]), dim=-1) if m % 2 else s
    return p[..., 0]


def token_shift(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-token shift of `x [..., H, D]` given channel scales [H, D], rounded to `SHIFT_DTYPE`."""
    # multiply, then add in the C kernel's order: einsum/bmm were 4x slower for these shapes on CPU (measured)
    return pairwise_sum(x.float() * shift_weights(scale)).to(SHIFT_DTYPE)


def rope_pair_amax(amax: torch.Tensor) -> torch.Tensor:
    """Per-channel amax [..., D] -> the bound of either channel of each RoPE rotation pair (c, c + D/2).

    RoPE (the rotate-half layout of Hugging Face Llama) turns channels c and c + D/2 of a key by an angle that
    grows with the position, so a key at a position the calibration text never reached can carry in channel c
    what the calibration only saw in c + D/2. sqrt(A_c^2 + A_{c+D/2}^2) bounds both components at every angle."""
    half = amax.shape[-1] // 2
    pair = torch.sqrt(amax[..., :half].square() + amax[..., half:].square())
    return torch.cat((pair, pair), dim=-1)


def calibrate_scale(
    fmt: KVFormat, x: torch.Tensor, margin: float = DEFAULT_MARGIN, rope_pairs: bool = False
) -> torch.Tensor:
    """Static scale for one layer's K (or V) from calibration values `x [T, H, D]`.

    tensor: amax over everything. channel: amax per (head, channel) of the shifted residual; the shift needs
    scales, so a first pass takes them from the raw per-channel amax. `rope_pairs` (keys after RoPE): each
    channel's amax is its rotation pair's bound (`rope_pair_amax`), so that keys past the calibration text's
    length, rotated further, do not clip: with per-channel amax alone, KL at 2K-8K tokens was 20x that at 0-1K.
    """
    if not fmt.quantized:
        raise ValueError(f"{fmt.kv_dtype} is not quantized: it has no scale to calibrate")
    x = x.float()
    if not fmt.shifted:
        return scale_from_amax(x.abs().amax(), storage_dtype(fmt), margin)
    pairs = rope_pair_amax if rope_pairs else (lambda amax: amax)
    first = scale_from_amax(pairs(x.abs().amax(dim=0)), storage_dtype(fmt), margin)
    residual = x - token_shift(x, first).float().unsqueeze(-1)
    return scale_from_amax(pairs(residual.abs().amax(dim=0)), storage_dtype(fmt), margin)


def encode(
    fmt: KVFormat,
    x: torch.Tensor,
    scale: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Encode `x [T, H, D]` into (payload [T, H, D] in the storage dtype, shift [T, H] or None).

    `scale` is one layer's scale: shape () for tensor mode, (H, D) for channel mode; unused when unquantized.
    `out` (payload, shift) of those shapes receives the result instead of new tensors.
    """
    dtype = storage_dtype(fmt)
    if not fmt.quantized:
        return (x.to(dtype), None) if out is None else (out[0].copy_(x), None)
    payload = torch.empty(x.shape, dtype=dtype, device=x.device) if out is None else out[0]
    shift = None
    if fmt.shifted:
        shift = (
            out[1]
            if out is not None and out[1] is not None
            else torch.empty(x.shape[:-1], dtype=SHIFT_DTYPE, device=x.device)
        )
    _encode_into(fmt, x, scale, payload, None, shift)
    return payload, shift


def _encode_into(
    fmt: KVFormat,
    x: torch.Tensor,
    scale: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor | None,
    shift: torch.Tensor | None,
) -> None:
    """Quantize `x [n, H, D]` into rows[slots] (into `rows`, of x's shape, when slots is None) and (channel
    mode) its shifts into `shift [n, H]`: one C pass on CPU (`cpu_kernels`), else torch."""
    weight = shift_weights(scale) if fmt.shifted else None
    if x.dim() == 3 and cpu_kernels.encode(x, scale, weight, shift, rows, slots):
        return
    token = None if shift is None else shift.copy_(token_shift(x, scale))
    quantized = _quantized(fmt, x, scale, token).to(rows.dtype)
    if slots is None:
        rows.copy_(quantized)
    else:
        rows[slots] = quantized


def _quantized(fmt: KVFormat, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor | None) -> torch.Tensor:
    """torch's path of the quantization: `(x - shift) / scale` clamped to the format's max, in fp32."""
    limit = fp8_max(storage_dtype(fmt))
    x = x.float()
    work = x / scale if shift is None else torch.sub(x, shift.float().unsqueeze(-1)).div_(scale)
    return work.clamp_(-limit, limit)


def store(
    fmt: KVFormat,
    x: torch.Tensor,
    scale: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    shift_rows: torch.Tensor | None = None,
) -> None:
    """Encode `x [n, H, D]` into `rows [R, H, D]` at `slots [n]`, and (channel mode) each token's shift into
    `shift_rows [R, H]`: what a cache write is. On CPU one C pass quantizes and scatters (`cpu_kernels`)."""
    if not fmt.quantized:
        rows[slots] = x.to(rows.dtype)
        return
    shift = torch.empty(x.shape[:-1], dtype=SHIFT_DTYPE, device=x.device) if fmt.shifted else None
    _encode_into(fmt, x, scale, rows, slots, shift)
    if shift_rows is not None:
        shift_rows[slots] = shift


def decode(
    fmt: KVFormat,
    payload: torch.Tensor,
    shift: torch.Tensor | None,
    scale: torch.Tensor,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Inverse of `encode`: payload [..., H, D] (+ shift [..., H]) -> values in `out_dtype` (into `out`).

    fp8 to fp32 on CPU is one C pass (`cpu_kernels`); otherwise a table lookup (`decode_table`), with a tensor
    scale folded into the table, so that a decode is one pass over the bytes. For fp32 output both equal
    `decode_reference` bit for bit.
    """
    if not fmt.quantized:
        return payload.to(out_dtype) if out is None else out.copy_(payload)
    if out_dtype == torch.float32 and payload.is_contiguous() and (out is None or out.is_contiguous()):
        heads, dim = payload.shape[-2:]
        flat_shift = None if shift is None else shift.reshape(-1, heads)
        fast = cpu_kernels.decode(
            payload.view(-1, heads, dim), None, scale, flat_shift, None if out is None else out.view(-1, heads, dim)
        )
        if fast is not None:
            return fast.view(payload.shape) if out is None else out
    table = decode_table(payload.dtype, payload.device)
    if not fmt.shifted:
        return lut_decode(payload.view(torch.uint8), table.mul(scale.float()).to(out_dtype), out)
    in_place = out is not None and out.dtype == torch.float32
    values = lut_decode(payload.view(torch.uint8), table, out if in_place else None).mul_(scale.float())
    values.add_(shift.float().unsqueeze(-1))
    if in_place:
        return values
    return values.to(out_dtype) if out is None else out.copy_(values)


def decode_reference(
    fmt: KVFormat,
    payload: torch.Tensor,
    shift: torch.Tensor | None,
    scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The slow, obvious decode through torch's casts: what `decode` and every fast read are checked against."""
    if not fmt.quantized:
        return payload.to(out_dtype)
    out = payload.float().mul_(scale.float())
    if shift is not None:
        out.add_(shift.float().unsqueeze(-1))
    return out.to(out_dtype)
