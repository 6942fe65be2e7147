"""Paged attention on a GPU: decode rows read our 16-token pages (fp8 with our scales) in a kernel.

    attention_for(device, fmt, compute_dtype)  ->  the fastest backend that can run here:
        FlashInferAttention   flashinfer importable, cuda, fp16/bf16 compute, an unquantized or fp8 tensor-scale
                              cache (FlashInfer's fp8 KV takes one k_scale / v_scale per layer; channel scales
                              and per-token shifts are ours only)
        TritonPagedAttention  triton importable, cuda (or TRITON_INTERPRET=1, which runs it on CPU for tests)
        CpuPagedAttention     cpu, fp32 compute, fp32 or tensor-scale fp8 pages, the C kernel built (cpu_attention.py)
        VarlenAttention       anything else: the CPU path, on CUDA tensors too

Both kernel backends attend decode rows (one query per sequence) in the kernel and hand every other row
(prefill chunks) to `VarlenAttention`. The Triton kernel runs one program per (sequence, kv head): it walks
the sequence's page table one 16-token page at a time, loads the page's bytes, decodes fp8 through our
256-entry table (`fp8.decode_table`, the tensor scale folded in; channel mode multiplies the per-channel scale
and adds the per-token shift), and keeps an online softmax, so only live pages are read and nothing is
materialised in the compute dtype. Every backend is tested against `ReferenceAttention`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import cast

import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model import cpu_attention
from kvbench.engines.kvengine.model.attention import AttentionBackend, VarlenAttention, VarlenLayout
from kvbench.engines.kvengine.model.batch import ForwardBatch
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def attention_for(device: torch.device | str, fmt: KVFormat, compute_dtype: torch.dtype) -> AttentionBackend:
    """The backend for a cache on `device` (see the module docstring for the order)."""
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda and flashinfer_available() and compute_dtype in (torch.float16, torch.bfloat16) and not fmt.shifted:
        return FlashInferAttention()
    if triton_available() and (on_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return TritonPagedAttention()
    if cpu_attention.applies(device, fmt, compute_dtype):
        return cpu_attention.CpuPagedAttention()
    return VarlenAttention()


@dataclass(slots=True)
class DecodeLayout:
    """Decode rows of a batch for a kernel, plus the packed layout of the other rows."""

    rows: torch.Tensor  # [Bd] int64 rows of the flat token axis
    page_table: torch.Tensor  # [Bd, max pages] int32 (padded with page 0, never read past a row's length)
    lens: torch.Tensor  # [Bd] int32 keys per row
    rest: VarlenLayout
    batch: ForwardBatch


def _decode_layout(batch: ForwardBatch) -> DecodeLayout:
    dev = batch.device
    decode = [i for i, n in enumerate(batch.query_lens) if n == 1]
    # the width is a power of two, so that a kernel compiled for one width serves every batch up to it
    width = 1 << (max((len(batch.page_tables[i]) for i in decode), default=1) - 1).bit_length()
    table = torch.zeros(len(decode), width, dtype=torch.int32)
    for row, i in enumerate(decode):
        table[row, : len(batch.page_tables[i])] = torch.tensor(batch.page_tables[i], dtype=torch.int32)
    rows = torch.tensor([batch.query_starts[i] for i in decode], dtype=torch.int64)
    lens = torch.tensor([batch.num_computed_tokens[i] + 1 for i in decode], dtype=torch.int32)
    rest = VarlenAttention().prepare(batch, decodes=False)
    return DecodeLayout(rows.to(dev), table.to(dev), lens.to(dev), rest, batch)


class TritonPagedAttention:
    """Decode rows in a Triton paged kernel, other rows packed (`VarlenAttention`)."""

    def prepare(self, batch: ForwardBatch) -> DecodeLayout:
        return _decode_layout(batch)

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        layout = cast(DecodeLayout, prepared)
        out = torch.empty_like(q)
        VarlenAttention.attend(q, cache, layer, layout.rest, out)
        if layout.rows.numel():
            out[layout.rows] = paged_decode(q[layout.rows].contiguous(), cache, layer, layout.page_table, layout.lens)
        return out


def paged_decode(
    q: torch.Tensor, cache: PagedKVCache, layer: int, page_table: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    """One query per row `q [B, Hq, D]` over its pages -> [B, Hq, D], with the Triton kernel."""
    from kvbench.engines.kvengine.model import triton_kernels

    c = cache.config
    B, hq, d = q.shape
    hkv = c.num_kv_heads
    out = torch.empty_like(q)
    fmt = cache.fmt
    mode = 0 if not fmt.quantized else (2 if fmt.shifted else 1)
    tables = cache.decode_tables(layer)  # (k, v) [256] fp32, or None
    dummy = torch.zeros(1, dtype=torch.float32, device=q.device)
    k_data, v_data = cache.k_data[layer], cache.v_data[layer]
    if mode:
        k_data, v_data = k_data.view(torch.uint8), v_data.view(torch.uint8)
    scale_k = cache.scales.k[layer] if mode == 2 else dummy
    scale_v = cache.scales.v[layer] if mode == 2 else dummy
    shift_k = cache.k_shift[layer] if mode == 2 else dummy
    shift_v = cache.v_shift[layer] if mode == 2 else dummy
    triton_kernels.paged_decode_kernel[(B, hkv)](
        q,
        out,
        k_data,
        v_data,
        tables[0] if tables else dummy,
        tables[1] if tables else dummy,
        scale_k,
        scale_v,
        shift_k,
        shift_v,
        page_table,
        lens,
        d**-0.5,
        page_table.stride(0),
        H=hkv,
        HQ=hq,
        D=d,
        G=hq // hkv,
        GP=triton_kernels.next_power_of_2(hq // hkv),
        PAGE=cache.page_size,
        MODE=mode,
        WIDTH=page_table.shape[1],
    )
    return out


class FlashInferAttention:
    """Decode rows through FlashInfer's paged decode (NHD pages of our page size, fp8 with a per-layer
    k_scale / v_scale), other rows packed (`VarlenAttention`). Planned once per forward."""

    def __init__(self, workspace_bytes: int = 128 * 1024 * 1024) -> None:
        self._workspace_bytes = workspace_bytes
        self._wrapper = None

    def prepare(self, batch: ForwardBatch) -> DecodeLayout:
        layout = _decode_layout(batch)
        self._planned = False
        return layout

    def _plan(self, layout: DecodeLayout, cache: PagedKVCache, q: torch.Tensor) -> None:
        import flashinfer

        if self._wrapper is None:
            workspace = torch.empty(self._workspace_bytes, dtype=torch.uint8, device=q.device)
            self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        ps = cache.page_size
        lens = layout.lens.to(torch.int64)
        pages = (lens + ps - 1) // ps
        indptr = torch.zeros(len(pages) + 1, dtype=torch.int32, device=q.device)
        indptr[1:] = torch.cumsum(pages, 0)
        width = torch.arange(layout.page_table.shape[1], device=q.device)
        indices = layout.page_table[width[None, :] < pages[:, None]].to(torch.int32)
        last = (lens - (pages - 1) * ps).to(torch.int32)
        c = cache.config
        self._wrapper.plan(
            indptr,
            indices,
            last,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            ps,
            pos_encoding_mode="NONE",
            q_data_type=q.dtype,
            kv_data_type=cache.k_data.dtype,
        )
        self._planned = True

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        layout = cast(DecodeLayout, prepared)
        out = torch.empty_like(q)
        VarlenAttention.attend(q, cache, layer, layout.rest, out)
        if layout.rows.numel():
            if not self._planned:
                self._plan(layout, cache, q)
            scales = {}
            if cache.tensor_scales is not None:
                scales = {"k_scale": cache.tensor_scales[0][layer], "v_scale": cache.tensor_scales[1][layer]}
            o = self._wrapper.run(q[layout.rows].contiguous(), (cache.k_data[layer], cache.v_data[layer]), **scales)
            out[layout.rows] = o
        return out


def describe(backend: AttentionBackend) -> str:
    """The backend's name for tables and logs."""
    return type(backend).__name__
