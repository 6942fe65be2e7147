"""Triton kernels of the GPU path (imported only where triton is installed; see gpu_attention.py)."""

from __future__ import annotations

import triton
import triton.language as tl

next_power_of_2 = triton.next_power_of_2


@triton.jit
def paged_decode_kernel(
    q_ptr,
    out_ptr,
    k_ptr,
    v_ptr,
    lut_k_ptr,
    lut_v_ptr,
    scale_k_ptr,
    scale_v_ptr,
    shift_k_ptr,
    shift_v_ptr,
    table_ptr,
    lens_ptr,
    sm_scale,
    stride_table,
    H: tl.constexpr,
    HQ: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    PAGE: tl.constexpr,
    MODE: tl.constexpr,
    WIDTH: tl.constexpr,
):
    """One program per (sequence, kv head): its G query heads over the sequence's pages, online softmax.

    k/v: one layer's pages [num_pages, PAGE, H, D] (MODE 0: values; 1, 2: fp8 bytes). MODE 1 decodes through
    the layer's scaled [256] tables; MODE 2 through the bare table, then * scale[H, D] + shift[page, PAGE, H].
    """
    seq = tl.program_id(0)
    head = tl.program_id(1)
    length = tl.load(lens_ptr + seq)
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    n = tl.arange(0, PAGE)
    g_ok = g < G
    q_rows = seq * HQ + head * G + g
    q = tl.load(q_ptr + q_rows[:, None] * D + d[None, :], mask=g_ok[:, None], other=0.0).to(tl.float32)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    if MODE == 2:
        scale_k = tl.load(scale_k_ptr + head * D + d)
        scale_v = tl.load(scale_v_ptr + head * D + d)
    # up to the table's width (a power of two: one compiled kernel per bucket), skipping pages past this
    # row's length. A loop bound loaded from memory would do on a GPU, but Triton's interpreter, which the
    # CPU tests use, cannot take a runtime loop bound with numpy 2.
    for j in range(0, WIDTH):
        if j * PAGE < length:
            page = tl.load(table_ptr + seq * stride_table + j).to(tl.int64)
            token = page * PAGE + n
            valid = j * PAGE + n < length
            offs = (token[:, None] * H + head) * D + d[None, :]
            if MODE == 0:
                k = tl.load(k_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
                v = tl.load(v_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
            else:
                k = tl.load(lut_k_ptr + tl.load(k_ptr + offs, mask=valid[:, None], other=0).to(tl.int32))
                v = tl.load(lut_v_ptr + tl.load(v_ptr + offs, mask=valid[:, None], other=0).to(tl.int32))
                if MODE == 2:
                    shift_k = tl.load(shift_k_ptr + token * H + head, mask=valid, other=0.0).to(tl.float32)
                    shift_v = tl.load(shift_v_ptr + token * H + head, mask=valid, other=0.0).to(tl.float32)
                    k = k * scale_k[None, :] + shift_k[:, None]
                    v = v * scale_v[None, :] + shift_v[:, None]
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * sm_scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_rows[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
