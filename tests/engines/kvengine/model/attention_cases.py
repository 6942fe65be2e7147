"""The mixed batch every fast attention path is checked on against the reference, on any device."""

from __future__ import annotations

import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model.attention import ReferenceAttention
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.calibration import calibrate_kv_scales
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.tiny import TINY_CONFIG

ALL_FORMATS = [
    ("fp32", None),
    ("bf16", None),
    ("fp16", None),
    ("fp8_e4m3", "tensor"),
    ("fp8_e4m3", "channel"),
    ("fp8_e5m2", "tensor"),
    ("fp8_e5m2", "channel"),
]


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, TINY_CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def max_error_against_reference(model, fmt_names, backend, device="cpu", compute_dtype=torch.float32) -> float:
    """Pages holding the same stored bytes, a mixed batch: a prompt from 0, decodes of ragged lengths, a chunk
    continuing a prefix whose pages it shares with another sequence. The largest difference, over every layer,
    between the backend's output and the reference attention's."""
    page_size = 16
    fmt = KVFormat.parse(*fmt_names)
    c = model.config
    scales = calibrate_kv_scales(model, tokens(64, seed=99), fmt)
    cache = PagedKVCache(c, 12, page_size, fmt, device, scales=scales, compute_dtype=compute_dtype)
    gen = torch.Generator().manual_seed(5)
    slots = torch.arange(12 * page_size, device=device)
    for layer in range(c.num_layers):
        k, v = (
            torch.randn(len(slots), c.num_kv_heads, c.head_dim, generator=gen).to(device, compute_dtype)
            for _ in range(2)
        )
        cache.write(layer, slots, k, v)
    batch = ForwardBatch.build(
        [
            SequenceChunk(tokens(1, 7), 20, [3, 8]),  # decode, 21 keys
            SequenceChunk(tokens(33, 8), 0, [5, 0, 11]),  # prompt from 0: causal
            SequenceChunk(tokens(4, 9), 16, [3, 1]),  # chunked prefill after 16 tokens in the first's page 3
            SequenceChunk(tokens(1, 11), 40, [2, 9, 6]),  # decode, 41 keys
            SequenceChunk(tokens(1, 12), 4, [10]),  # decode, 5 keys, part of one page
        ],
        page_size,
        device=device,
    )
    q = torch.randn(len(batch.input_ids), c.num_heads, c.head_dim, generator=gen).to(device, compute_dtype)
    reference = ReferenceAttention()
    want_layout, got_layout = reference.prepare(batch), backend.prepare(batch)
    worst = 0.0
    with torch.inference_mode():
        for layer in range(c.num_layers):
            want = reference(q, cache, layer, want_layout)
            got = backend(q, cache, layer, got_layout)
            worst = max(worst, float((got.float() - want.float()).abs().max()))
    return worst
