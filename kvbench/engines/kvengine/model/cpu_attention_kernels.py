"""Our engine's paged attention kernels in C (`kv_decode_attention`, `kv_prefill_attention` in `cpu_kernels.c`),
called straight over the pages by `cpu_attention.CpuPagedAttention`: the argument checks that keep the kernel's
pointers inside their tensors, and the calls. The library itself (its build, load and argument types) is
`cpu_kernels`'s.
"""

from __future__ import annotations

import ctypes

import torch

from kvbench.engines.kvengine.model.cpu_kernels import FORMAT_CODES, library, usable

ATTENTION_FORMATS = {torch.float32: -1, **FORMAT_CODES}  # page storage dtypes `decode_attention` reads


def _attention_applies(
    lib: ctypes.CDLL | None,
    q: torch.Tensor,
    out: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    index_tensors: tuple[torch.Tensor, ...],
) -> bool:
    """Whether an attention kernel takes these: built, fp32 queries and outputs over pages it reads, int64 indices,
    all contiguous on the CPU."""
    return (
        lib is not None
        and k_rows.dtype in ATTENTION_FORMATS
        and v_rows.dtype == k_rows.dtype
        and q.dtype == torch.float32
        and out.dtype == torch.float32
        and all(t.dtype == torch.int64 for t in index_tensors)
        and usable(q, out, k_rows, v_rows, *index_tensors)
    )


def _pages_match(
    q: torch.Tensor, out: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, page_size: int
) -> bool:
    """Whether q / out [*, Hq, D] and the pages k_rows / v_rows [pages * page_size, Hkv, D] fit one another."""
    num_rows, heads, dim = k_rows.shape
    return (
        tuple(v_rows.shape) == tuple(k_rows.shape)
        and num_rows % page_size == 0
        and q.dim() == 3
        and q.shape[2] == dim
        and q.shape[1] % heads == 0
        and out.shape == q.shape
    )


def decode_attention(
    q: torch.Tensor,
    out: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    page_size: int,
    scales: tuple[float, float],
    rows: torch.Tensor,
    page_table: torch.Tensor,
    lens: torch.Tensor,
    threads: int,
    lib: ctypes.CDLL | None = None,
) -> bool:
    """One query per sequence over its pages, in the kernel (`kv_decode_attention`): sequence s's query heads
    `q[rows[s]] [Hq, D]` attend keys 0..lens[s]-1 of its pages `page_table[s]` in `k_rows` / `v_rows`
    `[pages * page_size, Hkv, D]` (fp32, or fp8 with the tensor `scales` (k, v)); the result goes to
    `out[rows[s]]`. False when the kernel does not apply (not built, not CPU, not contiguous, another dtype):
    nothing is written then. `lib` as in `decode`."""
    lib = lib or library()
    index_tensors = (rows, page_table, lens)
    if not _attention_applies(lib, q, out, k_rows, v_rows, index_tensors):
        return False
    num_rows, heads, dim = k_rows.shape
    n, q_heads = len(rows), q.shape[1]
    if not _pages_match(q, out, k_rows, v_rows, page_size) or page_table.shape[0] != n or lens.shape != (n,):
        raise ValueError(
            f"decode_attention: q {tuple(q.shape)}, out {tuple(out.shape)}, pages {tuple(k_rows.shape)} "
            f"of {page_size} rows, page table {tuple(page_table.shape)}, lens {tuple(lens.shape)} "
            f"for {n} rows do not match"
        )
    if n and (int(rows.min()) < 0 or int(rows.max()) >= q.shape[0]):
        raise IndexError(f"decode_attention: a row of {rows.tolist()} is outside q's {q.shape[0]} rows")
    bad = lib.kv_decode_attention(
        ATTENTION_FORMATS[k_rows.dtype],
        k_rows.data_ptr(),
        v_rows.data_ptr(),
        num_rows // page_size,
        page_size,
        heads,
        dim,
        scales[0],
        scales[1],
        q.data_ptr(),
        rows.data_ptr(),
        q_heads,
        n,
        page_table.data_ptr(),
        page_table.shape[1],
        lens.data_ptr(),
        dim**-0.5,
        out.data_ptr(),
        threads,
    )
    if bad < 0:
        raise MemoryError("decode_attention: the kernel could not allocate its buffers")
    if bad:
        raise IndexError(
            f"decode_attention: sequence {bad - 1}'s length {int(lens[bad - 1])} or one of its pages "
            f"is outside the {num_rows // page_size} pages of {page_size}"
        )
    return True


def prefill_attention(
    q: torch.Tensor,
    out: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    page_size: int,
    scales: tuple[float, float],
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    computed: torch.Tensor,
    page_table: torch.Tensor,
    threads: int,
    lib: ctypes.CDLL | None = None,
) -> bool:
    """Chunks of queries over their pages, in the kernel (`kv_prefill_attention`): chunk s's rows
    `q[q_starts[s] : q_starts[s] + q_lens[s]] [*, Hq, D]`, query i at position computed[s] + i, attend keys
    0..computed[s] + i of its pages `page_table[s]` in `k_rows` / `v_rows` (as in `decode_attention`); the result
    goes to the same rows of `out`. False when the kernel does not apply (as in `decode_attention`): nothing is
    written then. `lib` as in `decode`."""
    lib = lib or library()
    index_tensors = (q_starts, q_lens, computed, page_table)
    if not _attention_applies(lib, q, out, k_rows, v_rows, index_tensors):
        return False
    num_rows, heads, dim = k_rows.shape
    n, q_heads = len(q_lens), q.shape[1]
    if (
        not _pages_match(q, out, k_rows, v_rows, page_size)
        or page_table.shape[0] != n
        or q_starts.shape != (n,)
        or computed.shape != (n,)
    ):
        raise ValueError(
            f"prefill_attention: q {tuple(q.shape)}, out {tuple(out.shape)}, pages {tuple(k_rows.shape)} "
            f"of {page_size} rows, page table {tuple(page_table.shape)}, starts {tuple(q_starts.shape)}, "
            f"lens {tuple(q_lens.shape)}, computed {tuple(computed.shape)} do not match"
        )
    bad = lib.kv_prefill_attention(
        ATTENTION_FORMATS[k_rows.dtype],
        k_rows.data_ptr(),
        v_rows.data_ptr(),
        num_rows // page_size,
        page_size,
        heads,
        dim,
        scales[0],
        scales[1],
        q.data_ptr(),
        q.shape[0],
        q_heads,
        n,
        q_starts.data_ptr(),
        q_lens.data_ptr(),
        computed.data_ptr(),
        page_table.data_ptr(),
        page_table.shape[1],
        dim**-0.5,
        out.data_ptr(),
        threads,
    )
    if bad < 0:
        raise MemoryError("prefill_attention: the kernel could not allocate its buffers")
    if bad:
        s = bad - 1
        raise IndexError(
            f"prefill_attention: chunk {s} (rows {int(q_starts[s])}.. of {int(q_lens[s])} queries after "
            f"{int(computed[s])} keys) or one of its pages is outside q's {q.shape[0]} rows or the "
            f"{num_rows // page_size} pages of {page_size}"
        )
    return True
