"""Paged forward == dense no-cache forward (transformers as the oracle), however the KV is paged."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model.attention import PaddedAttention, ReferenceAttention, VarlenAttention
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.config import RopeScaling
from kvbench.engines.kvengine.model.cpu_attention import CpuPagedAttention, applies
from kvbench.engines.kvengine.model.gpu_attention import attention_for
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.tiny import TINY_CONFIG, tiny_model

from .attention_cases import ALL_FORMATS, max_error_against_reference

TOL = 1e-4


def hf_twin(model):
    """transformers' implementation holding our tiny model's weights: the dense no-cache oracle."""
    cfg = model.config.to_hf_dict()
    cls, cfg_cls = (Qwen2ForCausalLM, Qwen2Config) if cfg["model_type"] == "qwen2" else (LlamaForCausalLM, LlamaConfig)
    cfg = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures")}
    hf = cls(cfg_cls(**cfg)).eval()
    hf.load_state_dict(model.state_dict(), strict=True)
    return hf


def dense_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, TINY_CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pages_for(n_tokens: int, page_size: int, ids: list[int]) -> list[int]:
    return ids[: -(-n_tokens // page_size)]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def hf(model):
    return hf_twin(model)


@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize(
    "attention",
    [ReferenceAttention(), PaddedAttention(), VarlenAttention(), CpuPagedAttention()],
    ids=["reference", "padded", "varlen", "cpu-paged"],
)
def test_chunked_prefill_then_decode_matches_dense(model, hf, page_size, attention):
    model.attention = attention
    prompt = tokens(37, seed=1)
    table = [11, 2, 7, 19, 0, 13, 4, 17, 8, 1]  # scattered, out of order
    cache = PagedKVCache(model.config, 20, page_size)
    computed = 0
    for chunk in (prompt[:10], prompt[10:27], prompt[27:]):
        batch = ForwardBatch.build([SequenceChunk(chunk, computed, table)], page_size, all_logits=True)
        got = model(batch, cache)
        want = dense_logits(hf, prompt[: computed + len(chunk)])[computed:]
        assert got.shape == want.shape
        assert (got - want).abs().max() < TOL
        computed += len(chunk)
    seq = list(prompt)
    for _ in range(5):  # greedy decode steps, one token each
        nxt = int(got[-1].argmax())
        seq.append(nxt)
        got = model(ForwardBatch.build([SequenceChunk([nxt], computed, table)], page_size), cache)
        computed += 1
        assert (got[0] - dense_logits(hf, seq)[-1]).abs().max() < TOL


@pytest.mark.parametrize(
    "attention",
    [ReferenceAttention(), PaddedAttention(), VarlenAttention(), CpuPagedAttention()],
    ids=["reference", "padded", "varlen", "cpu-paged"],
)
def test_sequences_sharing_prefix_pages_match_dense(model, hf, attention):
    model.attention = attention
    page_size = 4
    prefix = tokens(12, seed=2)  # exactly 3 full pages, later shared
    a_tail, b_tail = tokens(6, seed=3), tokens(9, seed=4)
    cache = PagedKVCache(model.config, 16, page_size)
    a_table = [9, 3, 14, 6, 1]
    model(ForwardBatch.build([SequenceChunk(prefix + a_tail, 0, a_table)], page_size), cache)
    # B reuses A's three prefix pages copy-free and computes only its own tail; A decodes in the same batch
    b_table = a_table[:3] + [10, 0, 12]
    a_next = tokens(1, seed=5)
    batch = ForwardBatch.build(
        [SequenceChunk(b_tail, 12, b_table), SequenceChunk(a_next, 18, a_table)], page_size, all_logits=True
    )
    got = model(batch, cache)
    want_b = dense_logits(hf, prefix + b_tail)[12:]
    want_a = dense_logits(hf, prefix + a_tail + a_next)[-1:]
    assert (got - torch.cat([want_b, want_a])).abs().max() < TOL


FAST_BACKENDS = [PaddedAttention(), VarlenAttention(), CpuPagedAttention()]
CPU_PAGED_FORMATS = [("fp32", None), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "tensor")]


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
@pytest.mark.parametrize("backend", FAST_BACKENDS, ids=["padded", "varlen", "cpu-paged"])
def test_fast_backends_equal_reference_on_every_format(model, fmt, backend):
    """Every layer's output of the fast path equals the oracle's up to fp32 rounding on a mixed batch of
    ragged decodes, a prompt, and a chunk continuing a shared prefix: it reads the stored bytes as the
    oracle does. The C kernel reads the formats it applies to; the others it refuses by name."""
    if isinstance(backend, CpuPagedAttention) and fmt not in CPU_PAGED_FORMATS:
        with pytest.raises(ValueError, match="CpuPagedAttention cannot read"):
            max_error_against_reference(model, fmt, backend)
        return
    assert max_error_against_reference(model, fmt, backend) < 1e-5


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_the_cpu_picks_the_paged_kernel_for_fp32_and_tensor_scale_fp8_pages(fmt):
    kv_format = KVFormat.parse(*fmt)
    assert applies("cpu", kv_format, torch.float32) == (fmt in CPU_PAGED_FORMATS)
    assert isinstance(attention_for("cpu", kv_format, torch.float32), CpuPagedAttention) == (fmt in CPU_PAGED_FORMATS)
    assert not isinstance(attention_for("cpu", kv_format, torch.bfloat16), CpuPagedAttention)


def test_the_paged_kernel_refuses_a_page_outside_the_cache(model):
    cache = PagedKVCache(model.config, 4, 16)
    batch = ForwardBatch.build([SequenceChunk([3], 20, [1, 9])], 16)  # page 9 of a 4-page cache
    q = torch.randn(1, model.config.num_heads, model.config.head_dim)
    backend = CpuPagedAttention()
    with pytest.raises(IndexError, match="sequence 0's length 21 or one of its pages is outside the 4 pages"):
        backend(q, cache, 0, backend.prepare(batch))


@pytest.mark.parametrize("fmt", [("bf16", None), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "channel")], ids=str)
def test_varlen_backend_in_bf16_compute_is_within_bf16_rounding_of_the_reference(fmt):
    model = tiny_model(seed=0, dtype=torch.bfloat16)
    assert max_error_against_reference(model, fmt, VarlenAttention(), compute_dtype=torch.bfloat16) < 2e-2


def test_qwen2_bias_and_llama3_rope_scaling_match_transformers():
    scaling = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)
    for overrides in (
        {"model_type": "qwen2", "attention_bias": True, "tie_word_embeddings": False},
        {"rope_scaling": scaling, "rope_theta": 500000.0},
    ):
        model = tiny_model(seed=3, **overrides)
        hf = hf_twin(model)
        ids = tokens(40, seed=10)
        cache = PagedKVCache(model.config, 8, 8)
        got = model(ForwardBatch.build([SequenceChunk(ids, 0, [7, 1, 5, 2, 6])], 8, all_logits=True), cache)
        assert (got - dense_logits(hf, ids)).abs().max() < TOL


def test_build_rejects_page_table_too_short():
    with pytest.raises(ValueError, match="page_table"):
        ForwardBatch.build([SequenceChunk([1, 2, 3], 14, [0])], 16)
    with pytest.raises(ValueError, match="token_ids is empty"):
        ForwardBatch.build([SequenceChunk([], 0, [0])], 16)
