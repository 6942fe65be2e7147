"""FP8 codecs: round-trip error within each format's rounding bound; channel + shift absorbs outliers."""

from __future__ import annotations

import pytest
import torch

from kvbench.engines.kvengine.core.kv_format import SCALE_MODES, KVDtype, KVFormat
from kvbench.engines.kvengine.model import fp8

# (relative rounding bound = 2^-(mantissa bits + 1), half the smallest subnormal step) per format
BOUNDS = {"fp8_e4m3": (2.0**-4, 2.0**-10), "fp8_e5m2": (2.0**-3, 2.0**-17)}
FP8_DTYPES = [dtype.value for dtype in KVDtype if dtype.quantized]
FORMATS = [KVFormat.parse(d, m) for d in FP8_DTYPES for m in SCALE_MODES]


def calibrated_scale(fmt: KVFormat, x: torch.Tensor) -> torch.Tensor:
    """Scale as calibration picks it, from x itself ([T, H, D])."""
    scale = fp8.calibrate_scale(fmt, x)
    assert scale.shape == fmt.scale_shape(x.shape[1], x.shape[2])
    return scale


def random_kv(seed: int, outliers: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 2, 64, generator=gen)
    if outliers:  # a few channels thousands of times larger, and tokens with a common offset
        x *= 0.05
        x[:, :, [3, 40]] *= 2000.0
        x[::8] += 3.0
    return x


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("outliers", [False, True])
def test_round_trip_error_within_rounding_bound(fmt, outliers):
    x = random_kv(seed=1, outliers=outliers)
    scale = calibrated_scale(fmt, x)
    payload, shift = fp8.encode(fmt, x, scale)
    assert payload.dtype == fp8.storage_dtype(fmt)
    assert (shift is not None) == fmt.shifted
    y = fp8.decode(fmt, payload, shift, scale, torch.float32)
    rel, half_subnormal = BOUNDS[fmt.kv_dtype]
    residual = x - (shift.float().unsqueeze(-1) if shift is not None else 0.0)
    bound = rel * residual.abs() + half_subnormal * scale + 1e-6 * x.abs() + 1e-6
    assert ((y - x).abs() <= bound).all()
    assert (y - x).abs().max() > 0  # it does quantize


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_channel_scale_and_shift_beat_tensor_scale_on_outlier_channels(kv_dtype):
    x = random_kv(seed=2, outliers=True)
    normal = torch.ones(64, dtype=torch.bool)
    normal[[3, 40]] = False
    errors = {}
    for mode in SCALE_MODES:
        fmt = KVFormat.parse(kv_dtype, mode)
        scale = calibrated_scale(fmt, x)
        y = fp8.decode(fmt, *fp8.encode(fmt, x, scale), scale, torch.float32)
        err = (y - x)[..., normal]
        errors[mode] = float(err.norm() / x[..., normal].norm())
    assert errors["channel"] < errors["tensor"] / 4, errors


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_values_beyond_the_calibrated_range_saturate(kv_dtype):
    fmt = KVFormat.parse(kv_dtype, "tensor")
    scale = torch.tensor(0.01)
    x = torch.tensor([[[1e6, -1e6, 1.0, 0.0]]])
    y = fp8.decode(fmt, *fp8.encode(fmt, x, scale), scale, torch.float32)
    limit = fp8.fp8_max(fp8.storage_dtype(fmt)) * 0.01
    assert torch.isfinite(y).all()
    assert y[0, 0, 0] == pytest.approx(limit) and y[0, 0, 1] == pytest.approx(-limit)


def test_unquantized_formats_store_the_dtype_itself():
    x = torch.randn(5, 2, 8)
    fmt = KVFormat.parse("fp32")
    payload, shift = fp8.encode(fmt, x, torch.tensor(1.0))
    assert shift is None and torch.equal(fp8.decode(fmt, payload, None, torch.tensor(1.0), torch.float32), x)


def test_parse_rejects_bad_names():
    with pytest.raises(ValueError, match="kv_dtype"):
        KVFormat.parse("int4")
    with pytest.raises(ValueError, match="scale_mode"):
        KVFormat.parse("bf16", "channel")
    with pytest.raises(ValueError, match="scale_mode"):
        KVFormat.parse("fp8_e4m3", "block")
    assert KVFormat.parse("fp8_e5m2").scale_mode == "tensor"


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_decode_table_equals_torch_cast_bit_for_bit_for_all_256_codes(kv_dtype):
    """The table is built from the format's bit layout, not through torch; torch's cast is the judge."""
    dtype = fp8.storage_dtype(KVFormat.parse(kv_dtype))
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = codes.view(dtype).float()
    got = fp8.decode_table(dtype)
    assert torch.equal(got.isnan(), want.isnan())
    assert int(got.isnan().sum()) == {"fp8_e4m3": 2, "fp8_e5m2": 6}[kv_dtype]
    finite = ~want.isnan()
    assert torch.equal(got[finite].view(torch.int32), want[finite].view(torch.int32))  # -0.0 and inf included
    assert torch.equal(
        fp8.lut_decode(codes.view(16, 16), got).view(torch.int32)[finite.view(16, 16)],
        want.view(16, 16).view(torch.int32)[finite.view(16, 16)],
    )


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_the_two_byte_lookup_of_a_bulk_decode_equals_the_one_byte_lookup_for_every_pair(
    kv_dtype, table_dtype, monkeypatch
):
    """Every (lo, hi) byte pair, in a [256, 256, 2] block: the 65,536-entry pair table (taken from
    PAIR_DECODE_MIN values on) gives the same bits as looking each byte up alone."""
    dtype = fp8.storage_dtype(KVFormat.parse(kv_dtype))
    table = (fp8.decode_table(dtype) * 0.37).to(table_dtype)
    pairs = torch.cartesian_prod(torch.arange(256), torch.arange(256)).to(torch.uint8).view(256, 256, 2)
    monkeypatch.setattr(fp8, "PAIR_DECODE_MIN", 10**9)
    one = fp8.lut_decode(pairs, table)
    monkeypatch.setattr(fp8, "PAIR_DECODE_MIN", pairs.numel())
    calls = []
    monkeypatch.setattr(fp8, "_pair_table", lambda t, real=fp8._pair_table: calls.append(1) or real(t))
    two = fp8.lut_decode(pairs, table)
    assert calls == [1]  # the pair path ran
    bits = torch.int16 if table_dtype == torch.bfloat16 else torch.int32  # NaN codes compare by their bits
    assert torch.equal(one.view(bits), two.view(bits))
    odd = fp8.lut_decode(pairs.view(-1)[1:], table)  # an odd count takes the one-byte path
    assert calls == [1] and torch.equal(odd.view(bits), one.view(-1)[1:].view(bits))


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_table_decode_equals_the_cast_reference_bit_for_bit_in_fp32(fmt):
    x = random_kv(seed=3, outliers=True)
    scale = calibrated_scale(fmt, x)
    payload, shift = fp8.encode(fmt, x, scale)
    want = fp8.decode_reference(fmt, payload, shift, scale, torch.float32)
    assert torch.equal(fp8.decode(fmt, payload, shift, scale, torch.float32), want)
    out = torch.empty_like(want)
    assert fp8.decode(fmt, payload, shift, scale, torch.float32, out=out) is out and torch.equal(out, want)
    # in bf16 the table decodes in fp32 and rounds once, the reference rounds the same fp32 value once too
    assert torch.equal(fp8.decode(fmt, payload, shift, scale, torch.bfloat16), want.to(torch.bfloat16))


def test_rope_pair_scales_keep_keys_rotated_past_the_calibration_text_in_range():
    """Keys whose energy sits in channel c at calibration and in c + D/2 after RoPE turns the pair by 90 degrees
    (a position the calibration text never reached): per-channel scales clip them, pair scales do not."""
    torch.manual_seed(0)
    T, H, D = 64, 2, 8
    x = torch.randn(T, H, D) * 0.01
    x[..., : D // 2] += torch.randn(T, H, D // 2) * 3.0  # channels 0..3 carry the energy, 4..7 almost none
    rotated = torch.cat((-x[..., D // 2 :], x[..., : D // 2]), dim=-1)  # RoPE's rotate-half at 90 degrees
    fmt = KVFormat.parse("fp8_e4m3", "channel")
    limit = fp8.fp8_max(torch.float8_e4m3fn)

    def peak(scale):  # the largest |value / scale| encode would meet, before saturation
        shift = fp8.token_shift(rotated, scale).float().unsqueeze(-1)
        return float(((rotated - shift) / scale).abs().max())

    per_channel = fp8.calibrate_scale(fmt, x)
    paired = fp8.calibrate_scale(fmt, x, rope_pairs=True)
    assert peak(per_channel) > 10 * limit  # clipped: the quiet channels' scales are ~300x too small
    assert peak(paired) <= limit
    assert torch.equal(paired[..., : D // 2], paired[..., D // 2 :])  # a pair shares one scale
    a = torch.tensor([[3.0, 1.0, 4.0, 0.0]])
    assert torch.allclose(fp8.rope_pair_amax(a), torch.tensor([[5.0, 1.0, 5.0, 1.0]]))  # sqrt(3^2 + 4^2) = 5
