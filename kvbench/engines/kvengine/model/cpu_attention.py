"""Paged attention on the CPU, in the C kernels (`cpu_kernels.c`), straight over the pages.

`VarlenAttention` gathers every live token of a sequence into a packed buffer, once per layer, then runs SDPA
over it: a decode row reads its KV twice (the copy, then SDPA) and writes it once. Here each decode row (one
query) is attended straight from its page table by `cpu_attention_kernels.decode_attention`, fp8 decoded on the fly, each
live byte read once. Measured on SmolLM2-135M, 2 AVX2 cores, batch 1 with ~560 keys: the gather and SDPA took
9.5 ms of a 53 ms decode step (`benchmarks/engine_bench.py`). Prefill chunks (many queries, a prompt or a chunk
after a cached prefix) go through `cpu_attention_kernels.prefill_attention`, causal blocks skipped and register-tiled: one
512-token prompt on SmolLM2's heads, 2 AVX-512 cores, 2.1-2.2 ms a layer against SDPA's 3.9-4.1 (causal SDPA on
CPU takes 512 keys as one block, so its causal mask saves nothing there), `benchmarks/attention_bench.py`.

Applies to fp32 compute over fp32 pages or fp8 pages with a tensor scale (`applies`); channel scales with
per-token shifts, and fp16/bf16 pages, stay on `VarlenAttention`. Tested against `ReferenceAttention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model import cpu_attention_kernels, cpu_kernels, fp8
from kvbench.engines.kvengine.model.batch import ForwardBatch
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache


def applies(device: torch.device | str, fmt: KVFormat, compute_dtype: torch.dtype) -> bool:
    """Whether the kernels can attend this cache: CPU, fp32 compute, fp32 or tensor-scale fp8
    pages, and the kernel built (`cpu_kernels.library`)."""
    return (
        torch.device(device).type == "cpu"
        and compute_dtype == torch.float32
        and not fmt.shifted
        and fp8.storage_dtype(fmt) in cpu_attention_kernels.ATTENTION_FORMATS
        and cpu_kernels.library() is not None
    )


def _page_table(tables: list[tuple[int, ...]]) -> torch.Tensor:
    """[len(tables), longest] int64, padded with page 0 (never read past a sequence's length)."""
    table = np.zeros((len(tables), max((len(t) for t in tables), default=1)), np.int64)
    for row, pages in enumerate(tables):
        table[row, : len(pages)] = pages
    return torch.from_numpy(table)


@dataclass(slots=True)
class CpuPagedLayout:
    """A batch's decode rows and its chunks of several queries, for the kernels."""

    rows: torch.Tensor  # [Bd] int64 decode rows of the flat token axis
    page_table: torch.Tensor  # [Bd, longest table] their pages
    lens: torch.Tensor  # [Bd] int64 keys per decode row
    chunk_starts: torch.Tensor  # [Bc] int64 first row of each chunk
    chunk_lens: torch.Tensor  # [Bc] int64 its queries
    chunk_computed: torch.Tensor  # [Bc] int64 keys before them
    chunk_table: torch.Tensor  # [Bc, longest table] their pages
    threads: int


class CpuPagedAttention:
    """Decode rows and chunks in the C kernels; equal to `ReferenceAttention` up to fp32 rounding."""

    def prepare(self, batch: ForwardBatch) -> CpuPagedLayout:
        decode = [i for i, n in enumerate(batch.query_lens) if n == 1]
        chunks = [i for i, n in enumerate(batch.query_lens) if n > 1]

        def column(values: tuple[int, ...], seqs: list[int], plus: int = 0) -> torch.Tensor:
            return torch.tensor([values[i] + plus for i in seqs], dtype=torch.int64)

        return CpuPagedLayout(
            column(batch.query_starts, decode),
            _page_table([batch.page_tables[i] for i in decode]),
            column(batch.num_computed_tokens, decode, 1),
            column(batch.query_starts, chunks),
            column(batch.query_lens, chunks),
            column(batch.num_computed_tokens, chunks),
            _page_table([batch.page_tables[i] for i in chunks]),
            torch.get_num_threads(),
        )

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        layout = cast(CpuPagedLayout, prepared)
        out = torch.empty_like(q)
        c = cache.config
        pages = (
            cache.k_data[layer].view(-1, c.num_kv_heads, c.head_dim),
            cache.v_data[layer].view(-1, c.num_kv_heads, c.head_dim),
            cache.page_size,
        )
        scales = cache.tensor_scales
        scale = (1.0, 1.0) if scales is None else (scales[0][layer], scales[1][layer])
        # channel scales and per-token shifts are not the kernels': refused before they read a byte
        ok = not cache.fmt.shifted
        if ok and layout.chunk_lens.numel():
            ok = cpu_attention_kernels.prefill_attention(
                q,
                out,
                *pages,
                scale,
                layout.chunk_starts,
                layout.chunk_lens,
                layout.chunk_computed,
                layout.chunk_table,
                layout.threads,
            )
        if ok and layout.rows.numel():
            ok = cpu_attention_kernels.decode_attention(
                q, out, *pages, scale, layout.rows, layout.page_table, layout.lens, layout.threads
            )
        if not ok:
            raise ValueError(
                f"CpuPagedAttention cannot read this cache ({cache.fmt} on {cache.device}, "
                f"{cache.compute_dtype}): build it where `cpu_attention.applies`"
            )
        return out
