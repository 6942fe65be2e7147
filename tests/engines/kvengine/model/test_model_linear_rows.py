"""Our row kernel (`cpu_kernels.linear_rows`, the linears of a decode step's few rows): torch's `F.linear` within
fp32 rounding at every row count, tail and bias it is given; refused where it does not apply (torch's path then);
and the forward sends a step through it only up to its row limit (`row_kernel_rows`), with the plain forward's logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvbench.engines.kvengine.model import cpu_kernels, llama
from kvbench.engines.kvengine.model.tiny import tiny_model
from tests.engines.kvengine.model.test_model_cpu_codec import PORTABLE
from tests.engines.kvengine.model.test_model_linears import batch_logits

native = pytest.mark.skipif(not cpu_kernels.has_linear_rows(), reason="this build has no AVX2+FMA row kernel")


@native
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9])  # odd counts take the one-row half of the two-row pass
@pytest.mark.parametrize("n", [1, 5, 64, 131])  # 1, 5, 131: the rows past a multiple of four (the tail loop)
@pytest.mark.parametrize("k, bias", [(8, False), (576, True), (1536, False)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_kernel_equals_torchs_linear(m, n, k, bias, threads):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x, weight = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    out = cpu_kernels.linear_rows(x, weight, b, threads)
    assert out is not None and out.shape == (m, n)
    torch.testing.assert_close(
        out,
        F.linear(x.double(), weight.double(), None if b is None else b.double()).float(),
        atol=1e-5 * k**0.5,
        rtol=1e-5,
    )


@native
def test_what_the_kernel_does_not_take_is_left_to_torch():
    x, weight = torch.randn(2, 16), torch.randn(4, 16)
    assert cpu_kernels.linear_rows(torch.randn(2, 12), torch.randn(4, 12), None, 2) is None  # k not a multiple of 8
    assert cpu_kernels.linear_rows(x.double(), weight.double(), None, 2) is None
    assert cpu_kernels.linear_rows(x, torch.randn(16, 4).t(), None, 2) is None  # strided weight
    assert cpu_kernels.linear_rows(x, weight.bfloat16(), None, 2) is None
    assert cpu_kernels.linear_rows(x, weight, None, 2, lib=cpu_kernels.load(PORTABLE)) is None  # no AVX2 path there
    with pytest.raises(ValueError, match="do not match"):
        cpu_kernels.linear_rows(x, torch.randn(4, 8), None, 2)
    with pytest.raises(ValueError, match="do not match"):
        cpu_kernels.linear_rows(x, weight, torch.randn(5), 2)


@native
def test_the_forward_uses_the_kernel_up_to_its_row_limit_and_gives_the_plain_logits(monkeypatch):
    model = tiny_model(seed=3)
    assert model.row_kernel_rows == llama.row_kernel_limit()  # fp32 on this CPU
    limit = model.row_kernel_rows = 8  # the kernel's rows whatever this CPU's limit: every case below reaches it
    calls = []
    real = cpu_kernels.linear_rows
    monkeypatch.setattr(cpu_kernels, "linear_rows", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    for rows in ([1], [1, 1, 1], [4, 4], [9], [5, 1, 1, 9]):
        calls.clear()
        kernel = batch_logits(model, rows)
        n = sum(rows)
        # four linears a layer with the step's n rows, then the head with one row a sequence where few enough
        head = [len(rows)] if n <= limit and len(rows) <= llama.ROW_KERNEL_HEAD_ROWS else []
        assert calls == ([n] * 4 * model.config.num_layers + head if n <= limit else [])
        model.row_kernel_rows = 0
        plain = batch_logits(model, rows)
        model.row_kernel_rows = limit
        torch.testing.assert_close(kernel, plain, atol=1e-4, rtol=1e-4)
    assert model.to(torch.float64).row_kernel_rows == 0  # fp32 weights only: a conversion turns it off
