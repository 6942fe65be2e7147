"""The forward's fused and prepacked linears compute what the Hugging Face-named ones do: q/k/v and gate/up are
views of one tensor each (one matmul, the state dict unchanged), and oneDNN-prepacked copies, used for steps of
more than one row on CPU, give the plain forward's logits."""

from __future__ import annotations

import pytest
import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.llama import can_prepack, prepacked_bytes
from kvbench.engines.kvengine.model.tiny import TINY_CONFIG, tiny_model
from kvbench.engines.kvengine.runtime.memory_budget import plan_memory
from kvbench.engines.kvengine.settings.config import EngineConfig

PS = 4


def batch_logits(model, rows_per_seq: list[int]) -> torch.Tensor:
    """Logits of a fresh batch: sequence i computes `rows_per_seq[i]` prompt tokens from position 0."""
    cache = PagedKVCache(model.config, 32, PS, KVFormat.from_settings("fp32", "tensor"), "cpu")
    chunks, page = [], 1
    for i, n in enumerate(rows_per_seq):
        pages = -(-n // PS)
        ids = torch.randint(0, TINY_CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(i)).tolist()
        chunks.append(SequenceChunk(ids, 0, list(range(page, page + pages))))
        page += pages
    return model(ForwardBatch.build(chunks, PS), cache)


def test_fused_projections_are_views_of_the_named_weights():
    model = tiny_model(seed=0)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()
    assert torch.equal(attn.qkv_weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(mlp.gate_up_weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert not any("qkv" in name or "gate_up" in name for name in model.state_dict())  # HF names only
    before = batch_logits(model, [3])
    with torch.no_grad():
        attn.v_proj.weight.mul_(2.0)  # an in-place change to a named weight reaches the fused matmul
    assert not torch.allclose(batch_logits(model, [3]), before)
    moved = model.to(torch.float64)  # a conversion rebuilds the fused tensors from the converted weights
    assert moved.model.layers[0].self_attn.qkv_weight.dtype == torch.float64
    assert (
        moved.model.layers[0].self_attn.q_proj.weight.data_ptr()
        == moved.model.layers[0].self_attn.qkv_weight.data_ptr()
    )


@pytest.mark.skipif(not can_prepack("cpu", torch.float32), reason="this torch has no oneDNN")
def test_prepacked_linears_give_the_plain_forward_logits():
    model = tiny_model(seed=3)
    plain = batch_logits(model, [5, 1, 1, 9])
    assert model.prepack() == prepacked_bytes(model) > 0
    packed = batch_logits(model, [5, 1, 1, 9])
    torch.testing.assert_close(packed, plain, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(batch_logits(model, [1]), batch_logits(model.fuse() or model, [1]))
    assert model.prepacked is None  # fuse dropped the copies, which a parameter change would make stale


def test_the_memory_budget_counts_the_prepacked_copies():
    with_copies = plan_memory(TINY_CONFIG, EngineConfig(model="tiny-random", kv_capacity=256), 1 << 34)
    without = plan_memory(
        TINY_CONFIG, EngineConfig(model="tiny-random", kv_capacity=256, prepacked_weights=False), 1 << 34
    )
    expected = prepacked_bytes(tiny_model(seed=0)) if can_prepack("cpu", torch.float32) else 0
    assert with_copies.weights - without.weights == expected


@pytest.mark.skipif(not can_prepack("cpu", torch.float32), reason="this torch has no oneDNN")
@pytest.mark.parametrize("capability, one_row_packed", [("AVX2", True), ("AVX512", False), ("DEFAULT", False)])
def test_one_row_steps_use_the_prepacked_weights_only_where_torchs_kernels_are_avx2(
    monkeypatch, capability, one_row_packed
):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    model = tiny_model(seed=3)
    model.row_kernel_rows = 0  # the few rows' own kernel aside (test_model_linear_rows.py): torch's linears only
    plain = batch_logits(model, [1])
    model.prepack()
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or real(*a))
    one_row = batch_logits(model, [1])
    assert bool(calls) == one_row_packed
    torch.testing.assert_close(one_row, plain, atol=1e-4, rtol=1e-4)
