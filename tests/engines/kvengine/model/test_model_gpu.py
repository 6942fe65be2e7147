"""The GPU path against the reference: kernel attention backends, CUDA-graph decode, the engine on CUDA.

Tests marked `gpu` need CUDA and skip without it (`ci/gpu-check.sh` runs them on a lent device). The Triton
kernel also runs here on CPU under Triton's interpreter when triton is installed and TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

import pytest
import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model import cpu_kernels
from kvbench.engines.kvengine.model.attention import VarlenAttention
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.cpu_attention import CpuPagedAttention
from kvbench.engines.kvengine.model.gpu_attention import (
    FlashInferAttention,
    TritonPagedAttention,
    attention_for,
    flashinfer_available,
    triton_available,
)
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.tiny import tiny_model

from .attention_cases import ALL_FORMATS, max_error_against_reference, tokens

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def test_without_a_gpu_or_kernels_the_cpu_path_is_chosen():
    fmt = KVFormat.parse("fp8_e4m3")
    backend = attention_for("cpu", fmt, torch.float32)
    cpu_kernel = CpuPagedAttention if cpu_kernels.library() is not None else VarlenAttention
    assert isinstance(backend, TritonPagedAttention if triton_available() and INTERPRETED else cpu_kernel)
    # channel scales with shifts are not the C kernel's
    assert type(attention_for("cpu", KVFormat.parse("fp8_e4m3", "channel"), torch.float32)) in (
        TritonPagedAttention if triton_available() and INTERPRETED else VarlenAttention,
    )


@pytest.mark.skipif(
    not (triton_available() and (CUDA or INTERPRETED)), reason="needs triton, on CUDA or with TRITON_INTERPRET=1"
)
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_triton_paged_decode_equals_reference(fmt):
    device = "cuda" if CUDA else "cpu"
    model = tiny_model(seed=0, device=device)
    assert max_error_against_reference(model, fmt, TritonPagedAttention(), device) < 1e-4


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_cpu_style_path_on_cuda_equals_reference(fmt):
    model = tiny_model(seed=0, device="cuda")
    assert max_error_against_reference(model, fmt, VarlenAttention(), "cuda") < 1e-4


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not flashinfer_available(), reason="needs flashinfer")
@pytest.mark.parametrize("fmt", [("bf16", None), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "tensor")], ids=str)
def test_flashinfer_decode_equals_reference(fmt):
    model = tiny_model(seed=0, device="cuda", dtype=torch.bfloat16)
    error = max_error_against_reference(model, fmt, FlashInferAttention(), "cuda", torch.bfloat16)
    assert error < 2e-2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fmt", [("fp32", None), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "channel")], ids=str)
def test_cuda_graph_decode_equals_eager_decode(fmt):
    from kvbench.engines.kvengine.model.cuda_graphs import DecodeGraphs

    model = tiny_model(seed=0, device="cuda")
    fmt = KVFormat.parse(*fmt)
    eager_cache = PagedKVCache(model.config, 40, 16, fmt, "cuda")
    graph_cache = PagedKVCache(model.config, 40, 16, fmt, "cuda")
    graphs = DecodeGraphs(model, graph_cache, max_batch=8, max_pages=8)
    prompts = [tokens(n, seed=n) for n in (5, 17, 33)]
    tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    prefill = ForwardBatch.build([SequenceChunk(p, 0, t) for p, t in zip(prompts, tables)], 16, device="cuda")
    want, got = model(prefill, eager_cache), graphs(prefill, graph_cache)  # prefill runs eagerly in both
    assert torch.equal(want, got)
    lengths = [len(p) for p in prompts]
    for _ in range(12):  # crosses page boundaries: 17 -> 29 and 33 -> 45 keys
        nxt = want.argmax(-1).tolist()
        batch = ForwardBatch.build(
            [SequenceChunk([t], n, tb) for t, n, tb in zip(nxt, lengths, tables)], 16, device="cuda"
        )
        want, got = model(batch, eager_cache), graphs(batch, graph_cache)
        assert (want - got).abs().max() < 1e-4
        lengths = [n + 1 for n in lengths]


@pytest.mark.gpu
@needs_cuda
def test_engine_on_cuda_with_graphs_and_a_host_tier_gives_the_cpu_tokens():
    """tiny-random on CUDA (graphs on, pages demoted through the side-stream copy and restored) generates
    what it generates on CPU."""
    from kvbench.engines.kvengine.runtime.engine import Engine
    from kvbench.engines.kvengine.runtime.requests import GenerationRequest
    from kvbench.engines.kvengine.settings.config import EngineConfig

    def generate(**settings) -> list[list[int]]:
        engine = Engine(EngineConfig(model="tiny-random", kv_capacity=96, host_capacity=1024, **settings))
        out: dict[str, list[int]] = {}
        for name, prompt in (("a", range(300, 380)), ("b", range(400, 480)), ("a2", range(300, 380))):
            engine.add(GenerationRequest(name, tuple(prompt), 8, ignore_eos=True))
            while engine.has_work():
                for step in engine.step():
                    if step.token_id is not None:
                        out.setdefault(step.request_id, []).append(step.token_id)
        engine.close()
        return [out["a"], out["b"], out["a2"]]

    cpu = generate()
    assert generate(device="cuda") == cpu
    assert generate(device="cuda", cuda_graphs=True) == cpu
