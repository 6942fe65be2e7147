"""Our engine's CPU kernels in C (`cpu_kernels.c`), built and loaded here: the fp8 KV codec as one C pass, fused
with the gather or scatter of token rows; paged decode and prefill attention straight over the pages
(in `cpu_attention_kernels`); and the model's row
kernels (`linear_rows`, `rope`, `silu_mul`, used by `llama.py`).

Why C: torch has no fast fp8 read on CPU. One SmolLM2 layer's K for 4,352 live tokens, one thread, measured
here: fp32 `index_select` 126-180 us; fp8 `index_select` + 256-entry table lookup (`fp8.lut_decode`) 680-700 us;
the same decode through fp16 bit operations in eager torch 690-800 us, and `torch.compile`d 855-890 us; this
kernel 151 us (e4m3), 123-134 us (e5m2): it reads a quarter of the bytes and, with AVX2 and F16C, converts 16
values a step through the fp16 converter.

Built on first use with the machine's C compiler (`$CC`, else `cc`; a new machine has gcc) into
`weights.cache_root()/_kernels/`, keyed by the source, the flags and the CPU, then loaded with ctypes (which
releases the GIL during a call). Where it cannot be built or loaded, or `KVBENCH_CPU_CODEC=0`, every caller
keeps torch's path (`fp8.py`), which gives the same bits: both are tested against torch's casts.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from kvbench.engines.kvengine.model.weights import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
DISABLE_ENV = "KVBENCH_CPU_CODEC"  # "0": never build or use the kernel
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-trapping-math", "-fPIC", "-shared")
# OpenMP for `kv_decode_attention`'s threads (libgomp.so.1: the copy torch has already loaded serves it); a
# compiler without it builds the same source single-threaded
OPENMP = ("-fopenmp",)
FORMAT_CODES = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}  # the kernel's `format` argument

_P = ctypes.c_void_p
_I = ctypes.c_int64
_DECODE_ARGS = [ctypes.c_int, _P, _I, _P, _I, _I, _I, _P, ctypes.c_int, _P, _P]
_ENCODE_ARGS = [ctypes.c_int, _P, _P, _I, _I, _I, _P, ctypes.c_int, _P, _P, _P, _I]
_F = ctypes.c_float
_ATTENTION_ARGS = [ctypes.c_int, _P, _P, _I, _I, _I, _I, _F, _F, _P, _P, _I, _I, _P, _I, _P, _F, _P, ctypes.c_int]
_PREFILL_ARGS = [ctypes.c_int, _P, _P, _I, _I, _I, _I, _F, _F, _P, _I, _I, _I, _P, _P, _P, _P, _I, _F, _P, ctypes.c_int]
_LINEAR_ARGS = [_P, _I, _I, _P, _I, _P, _P, ctypes.c_int]
_ROPE_ARGS = [_P, _I, _I, _I, _I, _P, _P, _P, ctypes.c_int]
_SILU_MUL_ARGS = [_P, _I, _I, _P, ctypes.c_int]


def _cpu_id() -> str:
    """What decides which instructions -march=native may use: the machine and the CPU's feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return platform.machine() + flags


def _build(compiler: str, flags: tuple[str, ...]) -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + repr((compiler, flags, _cpu_id())).encode()).hexdigest()[:16]
    target = cache_root() / "_kernels" / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)  # several ranks may build at once
    os.close(fd)
    try:
        subprocess.run([compiler, *flags, str(SOURCE), "-o", tmp], check=True, capture_output=True, text=True)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    """Build (once per source, flags and CPU) and load the kernel. Raises FileNotFoundError without a compiler,
    CalledProcessError when the build fails, OSError when the library does not load."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise FileNotFoundError("no C compiler: cc or $CC")
    lib = ctypes.CDLL(str(_build(compiler, flags)))
    lib.kv_decode.argtypes, lib.kv_decode.restype = _DECODE_ARGS, _I
    lib.kv_encode.argtypes, lib.kv_encode.restype = _ENCODE_ARGS, _I
    lib.kv_decode_attention.argtypes, lib.kv_decode_attention.restype = _ATTENTION_ARGS, _I
    lib.kv_prefill_attention.argtypes, lib.kv_prefill_attention.restype = _PREFILL_ARGS, _I
    lib.linear_rows.argtypes, lib.linear_rows.restype = _LINEAR_ARGS, _I
    lib.rope.argtypes, lib.rope.restype = _ROPE_ARGS, _I
    lib.silu_mul.argtypes, lib.silu_mul.restype = _SILU_MUL_ARGS, _I
    return lib


@cache
def library() -> ctypes.CDLL | None:
    """The kernel every caller uses, or None (disabled, no compiler, or the build failed: logged once)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    try:
        try:
            return load(FLAGS + OPENMP)
        except subprocess.CalledProcessError:
            return load()
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        log.warning("fp8 KV decodes through torch's table lookup (~4x slower): %s not built: %s", SOURCE.name, detail)
        return None


def usable(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or (t.device.type == "cpu" and t.is_contiguous()) for t in tensors)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check_shapes(
    scale: torch.Tensor, shift: torch.Tensor | None, shift_rows: int, heads: int, dim: int, *values: torch.Tensor
) -> None:
    """The kernel trusts its pointers: a shape that does not match would read or write past a tensor."""
    channel = scale.dim() > 0
    if tuple(scale.shape) not in ((), (heads, dim)):
        raise ValueError(f"scale has shape {tuple(scale.shape)}: () or ({heads}, {dim})")
    if channel != (shift is not None) or (
        shift is not None and (shift.dtype != torch.bfloat16 or tuple(shift.shape) != (shift_rows, heads))
    ):
        raise ValueError("a channel scale needs a bf16 shift [rows, heads], a tensor scale none")
    for v in values:
        if tuple(v.shape[1:]) != (heads, dim):
            raise ValueError(f"rows of shape {tuple(v.shape[1:])}; ({heads}, {dim}) expected")


def _check(bad: int, slots: torch.Tensor | None, n: int, num_rows: int) -> None:
    if bad and slots is None:
        raise IndexError(f"{n} tokens do not fit in the {num_rows} stored rows")
    if bad:
        raise IndexError(f"slot {int(slots[bad - 1])} is outside the {num_rows} stored rows")


def decode(
    rows: torch.Tensor,
    slots: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    out: torch.Tensor | None,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor | None:
    """fp32 values of the fp8 `rows [R, H, D]` at `slots [n]` (all R rows when None): `v * scale (+ shift)`
    with `scale` () or [H, D] and `shift` bf16 [R, H] (channel mode) -> `out` [n, H, D] (allocated when None).
    None when the kernel does not apply (not built, not CPU, not contiguous, not fp32 out): use torch's path.
    `lib`: a build of the kernel (`load`) to use instead of `library()`."""
    lib = lib or library()
    if (
        lib is None
        or rows.dtype not in FORMAT_CODES
        or (out is not None and out.dtype != torch.float32)
        or (slots is not None and slots.dtype != torch.int64)
        or scale.dtype != torch.float32
        or not usable(rows, slots, scale, shift, out)
    ):
        return None
    num_rows, heads, dim = rows.shape
    n = num_rows if slots is None else slots.shape[0]
    if out is None:
        out = torch.empty(n, heads, dim, dtype=torch.float32)
    if out.shape[0] != n:
        raise ValueError(f"out has {out.shape[0]} rows for {n} slots")
    _check_shapes(scale, shift, num_rows, heads, dim, out)
    bad = lib.kv_decode(
        FORMAT_CODES[rows.dtype],
        rows.data_ptr(),
        num_rows,
        _ptr(slots),
        n,
        heads,
        dim,
        scale.data_ptr(),
        int(scale.dim() > 0),
        _ptr(shift),
        out.data_ptr(),
    )
    _check(bad, slots, n, num_rows)
    return out


def encode(
    x: torch.Tensor,
    scale: torch.Tensor,
    weight: torch.Tensor | None,
    shift: torch.Tensor | None,
    rows: torch.Tensor,
    slots: torch.Tensor | None,
    lib: ctypes.CDLL | None = None,
) -> bool:
    """Store `x [n, H, D]` (fp32) as fp8 in `rows [R, H, D]` at `slots [n]` (rows 0..n-1 when None):
    `(x - shift) / scale`, clamped to the format's max, rounded to nearest even. Channel mode (`scale` [H, D])
    also computes each token's shift from `weight` [H, D] (`fp8.shift_weights`) as `fp8.token_shift` does and
    writes it into `shift` bf16 [n, H]; tensor mode takes neither. False when the kernel does not apply (then
    nothing is written). `lib` as in `decode`."""
    lib = lib or library()
    if (
        lib is None
        or rows.dtype not in FORMAT_CODES
        or x.dtype != torch.float32
        or scale.dtype != torch.float32
        or (slots is not None and slots.dtype != torch.int64)
        or (weight is not None and weight.dtype != torch.float32)
        or not usable(x, scale, weight, shift, rows, slots)
    ):
        return False
    n, heads, dim = x.shape
    num_rows = rows.shape[0]
    if slots is not None and slots.shape[0] != n:
        raise ValueError(f"{slots.shape[0]} slots for {n} tokens")
    _check_shapes(scale, shift, n, heads, dim, rows)
    if (weight is None) != (shift is None) or (weight is not None and tuple(weight.shape) != (heads, dim)):
        raise ValueError(f"a channel scale needs the shift weights [{heads}, {dim}], a tensor scale none")
    bad = lib.kv_encode(
        FORMAT_CODES[rows.dtype],
        x.data_ptr(),
        _ptr(slots),
        n,
        heads,
        dim,
        scale.data_ptr(),
        int(scale.dim() > 0),
        _ptr(weight),
        _ptr(shift),
        rows.data_ptr(),
        num_rows,
    )
    _check(bad, slots, n, num_rows)
    return True


def linear_rows(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, threads: int, lib: ctypes.CDLL | None = None
) -> torch.Tensor | None:
    """`x [m, k] @ weight[n, k].T (+ bias [n])` in the kernel (`linear_rows`: the weights streamed once, for the few
    rows of a decode step), fp32, contiguous, k a multiple of 8. None when the kernel does not apply (not built,
    no AVX2+FMA in this build, another dtype or layout): use torch's. `lib` as in `decode`."""
    lib = lib or library()
    if (
        lib is None
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or x.dim() != 2
        or (bias is not None and bias.dtype != torch.float32)
        or not usable(x, weight, bias)
    ):
        return None
    m, k = x.shape
    n = weight.shape[0]
    if tuple(weight.shape) != (n, k) or (bias is not None and tuple(bias.shape) != (n,)):
        raise ValueError(
            f"linear_rows: x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias "
            f"{None if bias is None else tuple(bias.shape)} do not match"
        )
    out = torch.empty(m, n, dtype=torch.float32)
    if lib.linear_rows(x.data_ptr(), m, k, weight.data_ptr(), n, _ptr(bias), out.data_ptr(), threads):
        return None
    return out


@cache
def has_linear_rows() -> bool:
    """Whether `linear_rows` runs here: the kernel is built, with its AVX2+FMA path."""
    lib = library()
    return lib is not None and linear_rows(torch.zeros(1, 8), torch.zeros(4, 8), None, 1, lib) is not None


def rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, threads: int, lib: ctypes.CDLL | None = None
) -> torch.Tensor | None:
    """Rotary embedding of `x [n, heads, D]` (each row's heads contiguous, rows any stride: a slice of the fused
    QKV output) with `cos` / `sin [n, D]`, halves layout, into a new contiguous [n, heads, D]: bit-equal to
    `llama.apply_rope`'s torch operations. None when the kernel does not apply (not built, not fp32 on a CPU,
    another layout, an odd D): use torch's. `lib` as in `decode`."""
    lib = lib or library()
    if (
        lib is None
        or x.dim() != 3
        or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in (x, cos, sin))
        or x.stride(2) != 1
        or x.stride(1) != x.shape[2]
        or not usable(cos, sin)
        or tuple(cos.shape) != (x.shape[0], x.shape[2])
        or cos.shape != sin.shape
    ):
        return None
    n, heads, dim = x.shape
    out = torch.empty(n, heads, dim, dtype=torch.float32)
    if lib.rope(x.data_ptr(), n, x.stride(0), heads, dim, cos.data_ptr(), sin.data_ptr(), out.data_ptr(), threads):
        return None
    return out


def silu_mul(gate_up: torch.Tensor, threads: int, lib: ctypes.CDLL | None = None) -> torch.Tensor | None:
    """`silu(gate) * up` of the fused gate-up output `gate_up [n, 2 * width]` (gate, then up) into a new
    [n, width], in one pass: within fp32 rounding of torch's (another e^x). None when the kernel does not apply
    (not built, not fp32 on a CPU, not contiguous, an odd width): use torch's. `lib` as in `decode`."""
    lib = lib or library()
    if (
        lib is None
        or gate_up.dim() != 2
        or gate_up.dtype != torch.float32
        or not usable(gate_up)
        or gate_up.shape[1] % 2
    ):
        return None
    n, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(n, width, dtype=torch.float32)
    lib.silu_mul(gate_up.data_ptr(), n, width, out.data_ptr(), threads)
    return out
