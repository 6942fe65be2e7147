"""The C fp8 codec (`cpu_kernels`): the same bits as torch's casts and torch's path, in both of its builds (SIMD
with -march=native, and the portable loop a build without AVX2/F16C gets), through the gather and the scatter."""

from __future__ import annotations

import pytest
import torch

from kvbench.engines.kvengine.core.kv_format import SCALE_MODES, KVDtype, KVFormat
from kvbench.engines.kvengine.model import cpu_kernels, fp8

FORMATS = [KVFormat.parse(d.value, m) for d in KVDtype if d.quantized for m in SCALE_MODES]
PORTABLE = tuple(f for f in cpu_kernels.FLAGS if f != "-march=native")  # x86-64 baseline: no AVX2, no F16C


@pytest.fixture(scope="module", params=["native", "portable"])
def lib(request):
    """Each build of the kernel. A new machine has gcc, so both must build here."""
    return cpu_kernels.load(cpu_kernels.FLAGS if request.param == "native" else PORTABLE)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, with every NaN as one pattern (NaN payloads are not part of the contract)."""
    t = torch.where(t.isnan(), torch.full_like(t, float("nan")), t)
    return t.view(torch.int32)


def channel_outputs(fmt: KVFormat, scale: torch.Tensor, n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What a channel-mode encode takes beside the values: the shift weights, and the [n, H] shifts it fills."""
    if not fmt.shifted:
        return None, None
    return fp8.shift_weights(scale), torch.full((n, scale.shape[0]), 7.0, dtype=torch.bfloat16)


def values_to_encode(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Everything rounding can get wrong: every midpoint between neighbouring fp8 values (ties to even) and
    next to them, subnormals, zeros of both signs, values past the max, and plain noise at several scales."""
    gen = torch.Generator().manual_seed(seed)
    table = fp8.decode_table(dtype)
    finite = table[torch.isfinite(table)].unique().sort().values
    mids = (finite[1:] + finite[:-1]) / 2
    near = torch.cat([mids, torch.nextafter(mids, mids.abs() * 2), torch.nextafter(mids, torch.zeros_like(mids))])
    limit = fp8.fp8_max(dtype)
    noise = [torch.randn(4096, generator=gen) * s for s in (limit / 4, 1.0, 1e-3, 1e-6)]
    edge = torch.tensor(
        [0.0, -0.0, limit, -limit, limit * 1.01, -limit * 3, 1e30, float("inf"), -float("inf"), float("nan")]
    )
    return torch.cat([near, -near, finite, *noise, edge])


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale", [1.0, 0.037, 3e37])  # 3e37 * 2^8 overflows: the SIMD build's scalar path
def test_decode_of_every_code_equals_torchs_cast_times_the_scale(lib, dtype, scale):
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 2, 8)
    s = torch.tensor(scale)
    got = cpu_kernels.decode(codes, None, s, None, None, lib=lib)
    assert torch.equal(bits(got), bits(codes.float() * s))


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("dim", [64, 12])  # 12: a head that is not a multiple of the SIMD width (the tail loop)
def test_encode_equals_torchs_path_bit_for_bit(lib, fmt, dim):
    dtype = fp8.storage_dtype(fmt)
    values = values_to_encode(dtype, seed=dim)
    heads = 3
    n = len(values) // (heads * dim)
    x = values[torch.randperm(len(values), generator=torch.Generator().manual_seed(1))][: n * heads * dim]
    x = x.reshape(n, heads, dim).contiguous()
    gen = torch.Generator().manual_seed(2)
    scale = torch.tensor(0.043) if not fmt.shifted else torch.rand(heads, dim, generator=gen) + 0.01
    weight, shift = channel_outputs(fmt, scale, n)
    got = torch.empty(n, heads, dim, dtype=dtype)
    assert cpu_kernels.encode(x, scale, weight, shift, got, None, lib=lib)
    want_shift = fp8.token_shift(x, scale) if fmt.shifted else None
    if fmt.shifted:  # each token's shift, summed in the same order as torch's path and rounded the same way
        assert torch.equal(bits(shift.float()), bits(want_shift.float()))
    want = fp8._quantized(fmt, x, scale, want_shift).to(dtype)
    assert torch.equal(bits(got.float()), bits(want.float()))  # every code, but for the sign of a NaN


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_scatter_then_gather_of_slots_equals_torch_on_the_same_rows(lib, fmt):
    """encode writes exactly the named rows (others untouched); decode of repeated, unordered slots equals the
    reference decode of those rows, shifts and per-channel scales included."""
    dtype, heads, dim, num_rows = fp8.storage_dtype(fmt), 2, 24, 40
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(7, heads, dim, generator=gen) * 3
    scale = torch.tensor(0.02) if not fmt.shifted else torch.rand(heads, dim, generator=gen) * 0.05 + 0.001
    shift = fp8.token_shift(x, scale) if fmt.shifted else None
    rows = torch.randint(0, 256, (num_rows, heads, dim), dtype=torch.uint8, generator=gen).view(dtype)
    before = rows.clone()
    slots = torch.tensor([9, 0, 39, 17, 3, 22, 30])
    weight, computed = channel_outputs(fmt, scale, len(slots))
    assert cpu_kernels.encode(x, scale, weight, computed, rows, slots, lib=lib)
    assert shift is None or torch.equal(computed.view(torch.int16), shift.view(torch.int16))
    untouched = torch.ones(num_rows, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(rows.view(torch.uint8)[untouched], before.view(torch.uint8)[untouched])
    assert torch.equal(rows.view(torch.uint8)[slots], fp8._quantized(fmt, x, scale, shift).to(dtype).view(torch.uint8))

    shift_rows = None if shift is None else torch.randn(num_rows, heads, generator=gen).bfloat16()
    read = torch.tensor([30, 30, 0, 11, 39, 2])
    got = cpu_kernels.decode(rows, read, scale, shift_rows, None, lib=lib)
    want = fp8.decode_reference(fmt, rows[read], None if shift_rows is None else shift_rows[read], scale, torch.float32)
    assert torch.equal(bits(got), bits(want))


def test_a_slot_outside_the_rows_is_refused_before_anything_is_written(lib):
    rows = torch.zeros(4, 1, 8, dtype=torch.float8_e4m3fn)
    x = torch.ones(2, 1, 8)
    with pytest.raises(IndexError, match="slot 4 is outside the 4 stored rows"):
        cpu_kernels.encode(x, torch.tensor(1.0), None, None, rows, torch.tensor([1, 4]), lib=lib)
    assert not rows.view(torch.uint8).any()
    with pytest.raises(IndexError, match="5 tokens do not fit in the 4 stored rows"):
        cpu_kernels.encode(torch.ones(5, 1, 8), torch.tensor(1.0), None, None, rows, None, lib=lib)
    assert not rows.view(torch.uint8).any()
    with pytest.raises(IndexError, match="slot -1"):
        cpu_kernels.decode(rows, torch.tensor([0, -1]), torch.tensor(1.0), None, None, lib=lib)


def test_shapes_that_do_not_match_are_refused_not_read_past(lib):
    rows = torch.zeros(4, 2, 8, dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="scale has shape"):
        cpu_kernels.decode(rows, None, torch.ones(2, 4), torch.zeros(4, 2).bfloat16(), None, lib=lib)
    with pytest.raises(ValueError, match="bf16 shift"):
        cpu_kernels.decode(rows, None, torch.ones(2, 8), None, None, lib=lib)
    with pytest.raises(ValueError, match="bf16 shift"):
        cpu_kernels.decode(rows, None, torch.ones(2, 8), torch.zeros(3, 2).bfloat16(), None, lib=lib)
    with pytest.raises(ValueError, match="3 rows for 4 slots"):
        cpu_kernels.decode(rows, None, torch.tensor(1.0), None, torch.empty(3, 2, 8), lib=lib)
    with pytest.raises(ValueError, match="rows of shape"):
        cpu_kernels.encode(torch.ones(2, 2, 4), torch.tensor(1.0), None, None, rows, None, lib=lib)
    with pytest.raises(ValueError, match="shift weights"):
        cpu_kernels.encode(
            torch.ones(4, 2, 8), torch.ones(2, 8), torch.ones(2, 4), torch.zeros(4, 2).bfloat16(), rows, None, lib=lib
        )


def test_what_the_kernel_does_not_take_is_left_to_torch(lib):
    rows = torch.zeros(4, 1, 8, dtype=torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    assert cpu_kernels.decode(rows, None, one, None, torch.empty(4, 1, 8, dtype=torch.bfloat16), lib=lib) is None
    assert cpu_kernels.decode(rows.view(torch.uint8), None, one, None, None, lib=lib) is None  # not an fp8 dtype
    strided = torch.zeros(4, 8, 2, dtype=torch.float8_e4m3fn).transpose(1, 2)  # [4, 2, 8], strided
    assert not strided.is_contiguous() and cpu_kernels.decode(strided, None, one, None, None, lib=lib) is None
    assert not cpu_kernels.encode(torch.ones(4, 1, 8, dtype=torch.float64), one, None, None, rows, None, lib=lib)


def test_disabled_by_the_environment_or_without_a_compiler_every_caller_keeps_torchs_path(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "library", cpu_kernels.library.__wrapped__)  # not the cached build
    monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "0")
    assert cpu_kernels.library() is None
    monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "1")
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert cpu_kernels.library() is None
    monkeypatch.delenv("CC")
    assert cpu_kernels.library() is not None
    fmt = KVFormat.parse("fp8_e4m3")
    x = torch.randn(5, 2, 8)
    monkeypatch.setattr(cpu_kernels, "library", lambda: None)
    payload, _ = fp8.encode(fmt, x, torch.tensor(0.01))
    assert torch.equal(payload.view(torch.uint8), (x / 0.01).clamp(-448, 448).to(payload.dtype).view(torch.uint8))
