"""Our decode attention kernel (`cpu_attention_kernels.decode_attention`) against float64 attention over the same stored
values, in both builds (native: AVX2 exp and OpenMP threads; portable: the scalar loop): lengths that end inside,
on and past its blocks of keys, scores whose max grows from block to block (the online softmax's rescale) or sits
in the first, scores far apart (e^x near underflow), fp8 pages with tensor scales, query groups, odd page sizes
and head dims, and the rows of q a batch names."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.engines.kvengine.model import cpu_attention_kernels, cpu_kernels
from tests.engines.kvengine.model.test_model_cpu_codec import PORTABLE

LENS = [1, 5, 63, 64, 65, 129, 700]  # one key; a page; a block less one, one block, one more; several; many


@pytest.fixture(scope="module", params=["native", "portable"])
def lib(request):
    return cpu_kernels.load(cpu_kernels.FLAGS + cpu_kernels.OPENMP if request.param == "native" else PORTABLE)


def pages_of(lens: list[int], page_size: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """A page table giving every sequence its own pages, shuffled over the cache, and the cache's page count."""
    need = [-(-n // page_size) for n in lens]
    num_pages = sum(need) + 3
    order = torch.randperm(num_pages, generator=gen)
    table = torch.zeros(len(lens), max(need), dtype=torch.int64)
    at = 0
    for s, n in enumerate(need):
        table[s, :n] = order[at : at + n]
        at += n
    return table, num_pages


def expected(q, k_rows, v_rows, page_size, scales, rows, table, lens) -> torch.Tensor:
    """float64 softmax attention over each sequence's keys, gathered through its page table."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    q_heads, kv_heads, dim = q.shape[1], k_rows.shape[1], q.shape[2]
    group = q_heads // kv_heads
    for s, row in enumerate(rows.tolist()):
        t = torch.arange(int(lens[s]))
        stored = table[s, t // page_size] * page_size + t % page_size
        k = k_rows[stored].double() * scales[0]  # [len, Hkv, D]
        v = v_rows[stored].double() * scales[1]
        for h in range(q_heads):
            scores = k[:, h // group] @ q[row, h].double() / math.sqrt(dim)
            out[row, h] = torch.softmax(scores, 0) @ v[:, h // group]
    return out


def run(
    lib,
    *,
    q_heads=9,
    kv_heads=3,
    dim=64,
    page_size=16,
    lens=LENS,
    dtype=torch.float32,
    scales=(1.0, 1.0),
    threads=2,
    keys=None,
    seed=0,
):
    gen = torch.Generator().manual_seed(seed)
    table, num_pages = pages_of(lens, page_size, gen)
    shape = (num_pages * page_size, kv_heads, dim)
    k_rows = torch.randn(shape, generator=gen) if keys is None else keys(shape, table, page_size, lens)
    k_rows, v_rows = k_rows.to(dtype), torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(len(lens) + 2, q_heads, dim, generator=gen)
    rows = torch.randperm(len(lens) + 2, generator=gen)[: len(lens)]  # the batch's rows of q, out of order
    out = torch.full_like(q, 7.0)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    assert cpu_attention_kernels.decode_attention(
        q, out, k_rows, v_rows, page_size, scales, rows, table, lens_t, threads, lib
    )
    want = expected(q, k_rows, v_rows, page_size, scales, rows, table, lens_t)
    untouched = torch.ones(len(q), dtype=torch.bool)
    untouched[rows] = False
    assert (out[untouched] == 7.0).all()  # rows outside the batch are not written
    return out[rows].double(), want[rows]


# fp32 pages are read key by key, fp8 pages in groups of keys (their sums reduced together, their values added
# into register tiles of 3 query rows): each layout is checked at every length, thread count, group and head dim
STORAGE = [torch.float32, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", STORAGE)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("page_size", [16, 5])
def test_the_kernel_equals_float64_attention_at_every_length(lib, threads, page_size, dtype):
    got, want = run(lib, threads=threads, page_size=page_size, dtype=dtype)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", STORAGE)
@pytest.mark.parametrize("q_heads, kv_heads, dim", [(4, 4, 64), (8, 2, 128), (6, 3, 36), (5, 1, 8), (7, 1, 40)])
def test_query_groups_and_head_dims(lib, q_heads, kv_heads, dim, dtype):
    """Groups of 1 to 7 query heads per kv head (whole tiles of 3 rows, and 1 or 2 left over); 36, 40 and 8
    values a head (the 8- and 32-lane loops' tails, and none)."""
    got, want = run(lib, q_heads=q_heads, kv_heads=kv_heads, dim=dim, dtype=dtype, seed=q_heads + dim)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def trend(slope: float):
    """Keys whose scores rise (slope > 0) or fall along each sequence, by ~|slope| * 60 from its first key to its
    last: the running max of an online softmax moves on in every block, or never after the first."""

    def keys(shape, table, page_size, lens):
        gen = torch.Generator().manual_seed(3)
        k = torch.randn(shape, generator=gen) * 0.1
        for s, n in enumerate(lens):
            for p, page in enumerate(table[s, : -(-n // page_size)].tolist()):  # the sequence's own pages
                position = torch.arange(page_size) + p * page_size
                k[page * page_size : (page + 1) * page_size] += (slope * position / 700.0)[:, None, None]
        return k

    return keys


@pytest.mark.parametrize("slope", [8.0, -8.0, 30.0])
def test_a_max_that_moves_from_block_to_block(lib, slope):
    """Keys all along one direction, scaled up along the sequence (slope 30: scores ~±80 apart, where e^x of the
    smallest is near underflow): every block rescales what the earlier ones summed, or none does."""
    got, want = run(lib, q_heads=3, kv_heads=3, keys=trend(slope), seed=4)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pages_with_tensor_scales(lib, dtype):
    got, want = run(lib, dtype=dtype, scales=(0.37, 1.9), seed=5)
    torch.testing.assert_close(got, want, atol=5e-6, rtol=1e-5)
