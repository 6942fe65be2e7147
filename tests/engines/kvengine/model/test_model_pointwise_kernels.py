"""Our per-element kernels, in both builds, against torch, at a decode step's rows and a prompt's (where they
thread); what they do not take is left to torch:
- rotary (`cpu_kernels.rope`, what `llama.apply_rope` runs on a CPU in fp32): torch's operations bit for bit, on
  the strided slices of the fused QKV output the forward hands it;
- the MLP's activation (`cpu_kernels.silu_mul`, what `llama.silu_and_mul` runs): torch's silu(gate) * up within
  fp32 rounding, over gates from far below to far above 0 (e^-gate past the float range on both sides)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvbench.engines.kvengine.model import cpu_kernels, llama
from tests.engines.kvengine.model.test_model_cpu_codec import PORTABLE


@pytest.fixture(scope="module", params=["native", "portable"])
def lib(request):
    return cpu_kernels.load(cpu_kernels.FLAGS + cpu_kernels.OPENMP if request.param == "native" else PORTABLE)


def torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's `x * cos + rotate_half(x) * sin`, written out in torch."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None, :] + torch.cat((-x2, x1), dim=-1) * sin[:, None, :]


def inputs(n: int, heads: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query heads as the forward slices them out of a fused QKV row (stride wider than heads * dim), and the
    cos / sin of positions 5.. at SmolLM2's theta."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, heads * dim + 3 * dim, generator=gen) * 4
    x = qkv[:, : heads * dim].view(n, heads, dim)
    freqs = (torch.arange(n) + 5)[:, None].float() / 100000.0 ** (torch.arange(0, dim, 2).float() / dim)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x, emb.cos(), emb.sin()


@pytest.mark.parametrize("n, heads, dim", [(1, 9, 64), (4, 3, 64), (300, 9, 64), (7, 2, 6)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_is_bit_equal_to_torchs_operations(lib, n, heads, dim, threads):
    x, cos, sin = inputs(n, heads, dim, seed=n + heads)
    out = cpu_kernels.rope(x, cos, sin, threads, lib)
    assert out is not None and out.is_contiguous()
    assert torch.equal(out, torch_rope(x, cos, sin))


def test_apply_rope_runs_the_kernel_and_gives_torchs_bits(monkeypatch):
    x, cos, sin = inputs(16, 9, 64, seed=1)
    calls = []
    real = cpu_kernels.rope
    monkeypatch.setattr(cpu_kernels, "rope", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert torch.equal(llama.apply_rope(x, cos, sin), torch_rope(x, cos, sin))
    assert calls == [1] and cpu_kernels.library() is not None


def test_what_the_kernel_does_not_take_is_left_to_torch(lib):
    x, cos, sin = inputs(4, 3, 64, seed=2)
    assert cpu_kernels.rope(x.double(), cos.double(), sin.double(), 1, lib) is None
    assert cpu_kernels.rope(x.transpose(0, 1), cos, sin, 1, lib) is None  # heads not adjacent in a row
    assert cpu_kernels.rope(x, cos[:3], sin[:3], 1, lib) is None  # one cos row short
    odd, c, s = inputs(4, 3, 5, seed=3)
    assert cpu_kernels.rope(odd, c[:, :5], s[:, :5], 1, lib) is None  # an odd head dim has no halves
    assert torch.equal(
        llama.apply_rope(x.double(), cos.double(), sin.double()), torch_rope(x.double(), cos.double(), sin.double())
    )


@pytest.mark.parametrize("n, width", [(1, 1536), (3, 13), (600, 1536)])  # 13: the 8-lane loop's tail
@pytest.mark.parametrize("threads", [1, 2])
def test_silu_mul_is_torchs_within_fp32_rounding(lib, n, width, threads):
    gen = torch.Generator().manual_seed(n + width)
    gate_up = torch.randn(n, 2 * width, generator=gen) * 6
    gate_up[0, :4] = torch.tensor([-200.0, -88.5, 90.0, 200.0])  # e^-gate over and under the float range
    out = cpu_kernels.silu_mul(gate_up, threads, lib)
    gate, up = gate_up.chunk(2, dim=-1)
    assert out is not None and out.shape == (n, width)
    torch.testing.assert_close(out, F.silu(gate) * up, atol=1e-30, rtol=4e-7)


def test_silu_and_mul_runs_the_kernel(monkeypatch):
    gate_up = torch.randn(5, 64)
    calls = []
    real = cpu_kernels.silu_mul
    monkeypatch.setattr(cpu_kernels, "silu_mul", lambda *a, **k: calls.append(1) or real(*a, **k))
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(llama.silu_and_mul(gate_up), F.silu(gate) * up, atol=0, rtol=4e-7)
    assert calls == [1]


def test_what_silu_mul_does_not_take_is_left_to_torch(lib):
    gate_up = torch.randn(4, 16)
    assert cpu_kernels.silu_mul(gate_up.double(), 1, lib) is None
    assert cpu_kernels.silu_mul(torch.randn(4, 15), 1, lib) is None  # no halves
    assert cpu_kernels.silu_mul(torch.randn(16, 4).t(), 1, lib) is None  # strided rows
    gate, up = gate_up.double().chunk(2, dim=-1)
    assert torch.equal(llama.silu_and_mul(gate_up.double()), F.silu(gate) * up)
