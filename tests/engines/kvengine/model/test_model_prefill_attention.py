"""Our prefill attention kernel (`cpu_attention_kernels.prefill_attention`) against float64 causal attention over the same
stored values, in both builds (native: AVX2 register tiles and OpenMP threads; portable: the scalar loops):
chunks from position 0 (a prompt) and after cached keys (a chunk continuing a prefix), lengths that end inside,
on and past its blocks of 16 queries and 64 keys, several chunks of different lengths in one call, scores whose
max moves from block to block, fp8 pages with tensor scales, query groups and head dims (the 16-value tiles'
tails), and rows outside the chunks left alone."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.engines.kvengine.model import cpu_attention_kernels, cpu_kernels
from tests.engines.kvengine.model.test_model_cpu_codec import PORTABLE
from tests.engines.kvengine.model.test_model_decode_attention import pages_of, trend

# (queries, keys before them): one query past a prefix; a prompt of 2; a block of queries less one, one, one
# more; a prompt of 130 (keys end inside a block); a chunk after a prefix that ends mid block; a long one
CHUNKS = [(2, 0), (15, 0), (16, 0), (17, 0), (130, 0), (37, 100), (64, 64), (200, 333)]


@pytest.fixture(scope="module", params=["native", "portable"])
def lib(request):
    return cpu_kernels.load(cpu_kernels.FLAGS + cpu_kernels.OPENMP if request.param == "native" else PORTABLE)


def expected(q, k_rows, v_rows, page_size, scales, starts, chunks, table) -> torch.Tensor:
    """float64 attention of each chunk's queries, query i at position computed + i over keys 0..computed + i."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    q_heads, kv_heads, dim = q.shape[1], k_rows.shape[1], q.shape[2]
    group = q_heads // kv_heads
    for s, (n, computed) in enumerate(chunks):
        t = torch.arange(computed + n)
        stored = table[s, t // page_size] * page_size + t % page_size
        k = k_rows[stored].double() * scales[0]  # [keys, Hkv, D]
        v = v_rows[stored].double() * scales[1]
        visible = t[None, :] <= (computed + torch.arange(n))[:, None]  # [n, keys]
        for h in range(q_heads):
            scores = q[starts[s] : starts[s] + n, h].double() @ k[:, h // group].T / math.sqrt(dim)
            weights = torch.softmax(scores.masked_fill(~visible, -math.inf), -1)
            out[starts[s] : starts[s] + n, h] = weights @ v[:, h // group]
    return out


def run(
    lib,
    *,
    q_heads=9,
    kv_heads=3,
    dim=64,
    page_size=16,
    chunks=CHUNKS,
    dtype=torch.float32,
    scales=(1.0, 1.0),
    threads=2,
    keys=None,
    seed=0,
):
    gen = torch.Generator().manual_seed(seed)
    table, num_pages = pages_of([n + computed for n, computed in chunks], page_size, gen)
    shape = (num_pages * page_size, kv_heads, dim)
    k_rows = (
        torch.randn(shape, generator=gen) if keys is None else keys(shape, table, page_size, [n + c for n, c in chunks])
    )
    k_rows, v_rows = k_rows.to(dtype), torch.randn(shape, generator=gen).to(dtype)
    # the chunks' rows of q in reverse order, with a row before, between and after them that no chunk owns
    starts, row = [], 1
    for n, _ in reversed(chunks):
        starts.insert(0, row)
        row += n + 1
    q = torch.randn(row, q_heads, dim, generator=gen)
    out = torch.full_like(q, 7.0)
    column = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
    assert cpu_attention_kernels.prefill_attention(
        q,
        out,
        k_rows,
        v_rows,
        page_size,
        scales,
        column(starts),
        column([n for n, _ in chunks]),
        column([c for _, c in chunks]),
        table,
        threads,
        lib,
    )
    want = expected(q, k_rows, v_rows, page_size, scales, starts, chunks, table)
    owned = torch.zeros(len(q), dtype=torch.bool)
    for start, (n, _) in zip(starts, chunks):
        owned[start : start + n] = True
    assert (out[~owned] == 7.0).all()  # rows outside the chunks are not written
    return out[owned].double(), want[owned]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("page_size", [16, 5])
def test_the_kernel_equals_float64_causal_attention_for_every_chunk(lib, threads, page_size):
    got, want = run(lib, threads=threads, page_size=page_size)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("q_heads, kv_heads, dim", [(4, 4, 64), (8, 2, 128), (6, 3, 36), (5, 1, 8), (2, 1, 24)])
def test_query_groups_and_head_dims(lib, q_heads, kv_heads, dim):
    """Groups of 1 to 5 query heads per kv head (5 x 16 rows: a last tile of 2 rows); 36, 24 and 8 values a
    head (the 16-value tiles' tails, and no tile at all)."""
    got, want = run(lib, q_heads=q_heads, kv_heads=kv_heads, dim=dim, chunks=CHUNKS[:6], seed=q_heads + dim)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("slope, atol", [(8.0, 2e-6), (-8.0, 2e-6), (30.0, 1e-5)])
def test_a_max_that_moves_from_block_to_block(lib, slope, atol):
    """Keys along one direction, scaled up along the sequence (slope 30: scores ~±80 apart): every block of keys
    rescales what the earlier ones summed, or none does. At slope 30 a score's fp32 rounding alone moves its
    weight by ~5e-6: torch's fp32 SDPA on the same inputs is 5.8e-6 off float64 (ours 6.0e-6)."""
    got, want = run(lib, q_heads=3, kv_heads=3, keys=trend(slope), seed=4)
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pages_with_tensor_scales(lib, dtype):
    got, want = run(lib, dtype=dtype, scales=(0.37, 1.9), seed=5)
    torch.testing.assert_close(got, want, atol=5e-6, rtol=1e-5)


def test_a_chunk_past_its_pages_or_rows_is_refused_before_anything_is_written(lib):
    gen = torch.Generator().manual_seed(6)
    table, num_pages = pages_of([40], 16, gen)  # three pages
    k = torch.randn(num_pages * 16, 3, 64, generator=gen)
    q, out = torch.randn(40, 9, 64, generator=gen), torch.full((40, 9, 64), 7.0)
    one = lambda value: torch.tensor([value], dtype=torch.int64)  # noqa: E731
    with pytest.raises(IndexError, match="chunk 0"):  # 40 queries after 20 keys: 60 keys, past its 3 pages
        cpu_attention_kernels.prefill_attention(q, out, k, k, 16, (1.0, 1.0), one(0), one(40), one(20), table, 2, lib)
    with pytest.raises(IndexError, match="outside q's 40 rows"):
        cpu_attention_kernels.prefill_attention(q, out, k, k, 16, (1.0, 1.0), one(5), one(40), one(0), table, 2, lib)
    bad = table.clone()
    bad[0, 1] = num_pages
    with pytest.raises(IndexError, match="chunk 0"):
        cpu_attention_kernels.prefill_attention(q, out, k, k, 16, (1.0, 1.0), one(0), one(40), one(0), bad, 2, lib)
    assert (out == 7.0).all()
