"""Paged attention on the CPU: decode rows read the pages in place, in the C kernel (`cpu_codec.c`).

`VarlenAttention` gathers every live token of a sequence into a packed buffer, once per layer, then runs SDPA
over it: a decode row reads its KV twice (the copy, then SDPA) and writes it once. Here each decode row (one
query) is attended straight from its page table by `cpu_codec.decode_attention`, fp8 decoded on the fly, each
live byte read once; prefill chunks still go through `VarlenAttention` (SDPA's flash kernel is the fast path
for many queries). Measured on SmolLM2-135M, 2 AVX2 cores, batch 1 with ~560 keys: the gather and SDPA took
9.5 ms of a 53 ms decode step (`benchmarks/engine_bench.py`).

Applies to fp32 compute over fp32 pages or fp8 pages with a tensor scale (`applies`); channel scales with
per-token shifts, and fp16/bf16 pages, stay on `VarlenAttention`. Tested against `ReferenceAttention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model import cpu_codec, fp8
from kvbench.engines.kvengine.model.attention import VarlenAttention, VarlenLayout
from kvbench.engines.kvengine.model.batch import ForwardBatch
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache


def applies(device: torch.device | str, fmt: KVFormat, compute_dtype: torch.dtype) -> bool:
    """Whether the kernel can attend this cache's decode rows: CPU, fp32 compute, fp32 or tensor-scale fp8
    pages, and the kernel built (`cpu_codec.library`)."""
    return (torch.device(device).type == "cpu" and compute_dtype == torch.float32 and not fmt.shifted
            and fp8.storage_dtype(fmt) in cpu_codec.ATTENTION_FORMATS and cpu_codec.library() is not None)


@dataclass(slots=True)
class CpuDecodeLayout:
    """A batch's decode rows for the kernel, and the packed layout of its other rows."""

    rows: torch.Tensor  # [Bd] int64 rows of the flat token axis
    page_table: torch.Tensor  # [Bd, longest table] int64, padded with page 0 (never read past a row's length)
    lens: torch.Tensor  # [Bd] int64 keys per row
    rest: VarlenLayout
    threads: int


class CpuPagedAttention:
    """Decode rows in the C kernel, other rows packed (`VarlenAttention`); equal to `ReferenceAttention` up to
    fp32 rounding."""

    def prepare(self, batch: ForwardBatch) -> CpuDecodeLayout:
        decode = [i for i, n in enumerate(batch.query_lens) if n == 1]
        table = np.zeros((len(decode), max((len(batch.page_tables[i]) for i in decode), default=1)), np.int64)
        for row, i in enumerate(decode):
            table[row, : len(batch.page_tables[i])] = batch.page_tables[i]
        rows = torch.tensor([batch.query_starts[i] for i in decode], dtype=torch.int64)
        lens = torch.tensor([batch.num_computed_tokens[i] + 1 for i in decode], dtype=torch.int64)
        rest = VarlenAttention().prepare(batch, decodes=False)
        return CpuDecodeLayout(rows, torch.from_numpy(table), lens, rest, torch.get_num_threads())

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        layout = cast(CpuDecodeLayout, prepared)
        out = torch.empty_like(q)
        VarlenAttention.attend(q, cache, layer, layout.rest, out)
        if layout.rows.numel():
            c = cache.config
            scales = cache.tensor_scales
            # channel scales and per-token shifts are not the kernel's: refused before it reads a byte
            ok = not cache.fmt.shifted and cpu_codec.decode_attention(
                q, out, cache.k_data[layer].view(-1, c.num_kv_heads, c.head_dim),
                cache.v_data[layer].view(-1, c.num_kv_heads, c.head_dim), cache.page_size,
                (1.0, 1.0) if scales is None else (scales[0][layer], scales[1][layer]),
                layout.rows, layout.page_table, layout.lens, layout.threads)
            if not ok:
                raise ValueError(f"CpuPagedAttention cannot read this cache ({cache.fmt} on {cache.device}, "
                                 f"{cache.compute_dtype}): build it where `cpu_attention.applies`")
        return out
