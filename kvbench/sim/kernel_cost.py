"""A step's kernel time from measured tables: the GEMMs, MoE, attention and all-reduces one forward pass runs.

What one step of a tensor-parallel group over `tp` devices launches, per device (aiconfigurator's op list):

    per layer   qkv GEMM (m=tokens, n=(heads + 2 kv_heads) * head_dim / tp, k=hidden)
                o GEMM   (m=tokens, n=hidden, k=heads * head_dim / tp)
                MLP      dense: gate_up (n=2 * inter / tp, k=hidden) and down (n=hidden, k=inter / tp);
                         MoE: the fused-MoE table (tokens, hidden, expert inter, top-k, experts, tp) plus the
                         router GEMM (n=experts, k=hidden) and shared experts as a dense MLP
                attention decode: (batch of decodes, their mean context) per full / sliding layer;
                          prefill: each chunk [start, end) costs prefill(end) - prefill(start) of the
                          batch-1 curve (what a causal chunk adds to its prefix), at least prefill(end - start);
                          past the measured 16K, quadratic in the length (`kernel_tables.PrefillAttention`)
                2 all-reduces of tokens x hidden bf16 elements (tp > 1)
    once        lm_head GEMM for one token per sequence (m=sequences, n=vocab / tp, k=hidden)

The GEMM and all-reduce curves depend on the step's token count only, so each is looked up once per token
count and kept (`linear_seconds`); a batch's decode curve is kept per batch size. Left out (the fitted
per-step overhead holds them): norms, rotary, activations, sampling, the scheduler and launches. A part the
tables lack (MLA attention, an unmeasured MoE shape, a window other than 0 or 128) is None: `for_model` then
returns None and the cost model keeps its roofline for the whole step, so no step mixes the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.sim.geometry import ModelGeometry, dtype_bytes
from kvbench.sim.kernel_tables import AttentionShape, Curve, DecodeAttention, KernelTables, PrefillAttention

GEMM_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "bfloat16": "bfloat16", "fp8": "fp8"}
MOE_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "bfloat16": "bfloat16", "fp8": "fp8", "mxfp4": "w4a16_mxfp4"}


def kv_table_dtype(kv_dtype: str) -> str | None:
    """The tables' KV dtype for a simulated one: 1-byte KV is their fp8, 2-byte their bfloat16."""
    size = dtype_bytes(kv_dtype)
    return {1: "fp8", 2: "bfloat16"}.get(size)


@dataclass(frozen=True, slots=True)
class _Layer:
    """The curves of one kind of layer (full or sliding attention)."""

    count: int
    decode: DecodeAttention
    prefill: PrefillAttention


@dataclass(slots=True)
class StepKernels:
    """Seconds of a step's kernels for one model, tensor-parallel degree and dtypes (built by `for_model`)."""

    tables: KernelTables
    layers: tuple[_Layer, ...]
    gemms: tuple[tuple[int, Curve], ...]  # (times per step, curve over tokens)
    lm_head: Curve
    allreduce: Curve | None  # None: tp == 1
    allreduce_per_step: int
    message_elements_per_token: int  # an all-reduce's size: the tables count elements, not bytes
    _linear: dict[int, float] = field(default_factory=dict)
    _decode: dict[int, tuple[Curve, ...]] = field(default_factory=dict)

    def linear_seconds(self, tokens: int, seqs: int) -> float:
        """GEMMs, MoE and all-reduces of a step of `tokens` tokens over `seqs` sequences."""
        seconds = self._linear.get(tokens)
        if seconds is None:
            seconds = self._linear[tokens] = self.gemm_seconds(tokens) + self.allreduce_seconds(tokens)
        return seconds + float(self.lm_head.at(seqs))

    def gemm_seconds(self, tokens: int) -> float:
        """The layers' GEMMs and MoE at `tokens` tokens (the lm_head apart)."""
        return float(sum(times * c.at(tokens) for times, c in self.gemms))

    def allreduce_seconds(self, tokens: int) -> float:
        if self.allreduce is None:
            return 0.0
        return self.allreduce_per_step * float(self.allreduce.at(tokens * self.message_elements_per_token))

    def decode_seconds(self, batch: int, context_sum):
        """Attention of `batch` decodes whose contexts sum to `context_sum` (a number or an array of steps)."""
        if batch == 0:
            return 0.0
        curves = self._decode.get(batch)
        if curves is None:
            curves = self._decode[batch] = tuple(layer.decode.for_batch(batch) for layer in self.layers)
        mean = context_sum / batch if isinstance(context_sum, (int, float)) else np.asarray(context_sum) / batch
        return sum(layer.count * c.at(mean) for layer, c in zip(self.layers, curves))

    def prefill_seconds(self, start: int, end: int) -> float:
        """Attention of one prefill chunk computing tokens [start, end) after `start` cached ones."""
        total = 0.0
        for layer in self.layers:
            p = layer.prefill
            total += layer.count * max(
                float(p.at(end) - p.at(start)) if start else float(p.at(end)), float(p.at(end - start))
            )
        return total

    @classmethod
    def for_model(
        cls, tables: KernelTables, g: ModelGeometry, tp: int, kv_dtype: str, weight_dtype: str | None = None
    ) -> StepKernels | None:
        """The model's kernels on `tp` devices, or None where the tables cannot price every part of a step."""
        kv = kv_table_dtype(kv_dtype)
        if g.mla is not None or kv is None or g.num_heads % tp or (g.num_kv_heads % tp and tp % g.num_kv_heads):
            return None
        heads, kv_heads = g.num_heads // tp, max(g.num_kv_heads // tp, 1)
        layers = []
        for count, window in ((g.full_layers, 0), (g.sliding_layers, g.sliding_window or 0)):
            if count:
                shape = AttentionShape(heads, kv_heads, g.head_dim, window, kv)
                decode, prefill = tables.decode_attention(shape), tables.prefill_attention(shape)
                if decode is None or prefill is None:
                    return None
                layers.append(_Layer(count, decode, prefill))
        dtypes = g.weight_dtypes(weight_dtype)
        gemms = _gemms(tables, g, tp, dtypes.attention, dtypes.mlp, dtypes.experts)
        lm_head = tables.gemm_curve(GEMM_DTYPES.get(dtypes.embeddings, ""), g.vocab_size // tp, g.hidden_size)
        if gemms is None or lm_head is None:
            return None
        allreduce = tables.allreduce_curve(tp) if tp > 1 else None
        if tp > 1 and allreduce is None:
            return None
        return cls(tables, tuple(layers), gemms, lm_head, allreduce, 2 * g.num_layers, g.hidden_size)


def _gemms(
    tables: KernelTables, g: ModelGeometry, tp: int, attention: str, mlp: str, experts: str
) -> tuple[tuple[int, Curve], ...] | None:
    """(times per step, curve) of every GEMM and MoE a step runs; None where one is unmeasured."""
    h, d = g.hidden_size, g.head_dim
    shapes = [
        (g.num_layers, attention, (g.num_heads + 2 * g.num_kv_heads) * d // tp, h),
        (g.num_layers, attention, h, g.num_heads * d // tp),
    ]
    moe_layers = g.moe.num_layers if g.moe else 0
    dense = g.num_layers - moe_layers
    if dense:
        shapes += [(dense, mlp, 2 * g.intermediate_size // tp, h), (dense, mlp, h, g.intermediate_size // tp)]
    curves = []
    if g.moe is not None:
        m = g.moe
        if m.shared_experts:
            inter = m.shared_experts * m.expert_intermediate
            shapes += [(moe_layers, mlp, 2 * inter // tp, h), (moe_layers, mlp, h, inter // tp)]
        shapes.append((moe_layers, "bf16", m.num_experts, h))  # the router
        fused = tables.moe_curve(MOE_DTYPES.get(experts, ""), h, m.expert_intermediate, m.top_k, m.num_experts, tp)
        if fused is None:
            return None
        curves.append((moe_layers, fused))
    for times, dtype, n, k in shapes:
        c = tables.gemm_curve(GEMM_DTYPES.get(dtype, ""), n, k)
        if c is None:
            return None
        curves.append((times, c))
    return tuple(curves)
