"""Cost model: seconds for an engine step, for a KV transfer between tiers, and for a pipelined restore.

Where measured kernel tables cover the device, the engine and the model (`kernel_cost.StepKernels`: H100 and
H200 SXM, vLLM / SGLang / TensorRT-LLM, aiconfigurator-core's measurements), a step's busy time is the sum of
its kernels' measured latencies (GEMMs and MoE at the step's tokens, decode attention by batch and context,
prefill attention per chunk, the all-reduces), and only the per-step overhead is fitted:

    step = kernels(step) + overhead          (flops, bytes, compute_s and memory_s stay the roofline's)

Elsewhere a step is roofline-timed on the tensor-parallel group: the larger of compute time (FLOPs over
effective FLOP/s) and memory time (bytes over effective bandwidth), plus the all-reduces tensor parallelism
adds (two per layer) and a fixed per-step overhead:

    step = max(flops / (tp * flops_eff), bytes / (tp * bw_eff)) + 2 * layers * allreduce(tokens) + overhead

(the sum instead of the max on a device that does not overlap the two: `Device.overlap`, false for a CPU)
    flops = tokens * 2 * active params + sum over tokens of attention over their context
    bytes = weights read once (MoE: only the experts some token routed to) + KV read + KV written
    (a sliding layer reads and attends its whole window a token: exact past the window, which is 128
    tokens for gpt-oss)

A restore moves pages from lower tiers to the device through the host, as a pipeline of chunks (disk or
remote -> host, host -> device) whose stages overlap: its time is the slowest stage plus one chunk of each
other stage (the pipeline's fill), plus each stage's latency.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.sim.geometry import ModelGeometry
from kvbench.sim.hardware import Hardware, Link
from kvbench.sim.kernel_cost import StepKernels

ACTIVATION_BYTES = 2  # bf16 activations in all-reduces
RESTORE_CHUNK_TOKENS = 256  # LMCache's default chunk size


class Span(Protocol):
    """What a step needs to know of a sequence: it computes tokens [start, end). SeqWork is one; so is the
    scheduler's ScheduledSeq, which the simulator passes as is rather than copying every sequence every step."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step: it computes tokens [start, end) attending to everything before."""

    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class StepCost:
    seconds: float
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    comm_s: float


@dataclass(frozen=True, slots=True)
class CostModel:
    geometry: ModelGeometry
    hardware: Hardware
    kv_dtype: str = "fp16"
    weight_dtype: str | None = None  # None: the checkpoint's own
    # True for an engine whose attention pads every sequence of a step to the longest query and the longest
    # page-rounded context and computes the full (masked) score matrix (our engine's first fast path,
    # model.attention.PaddedAttention; its VarlenAttention reads only each sequence's live tokens: False).
    padded_attention: bool = False
    page_size: int = DEFAULT_PAGE_SIZE  # padded attention reads whole pages
    # The step's kernels from measured tables (module docstring); None: the roofline prices every step.
    kernels: StepKernels | None = field(default=None, compare=False)
    # Per-step constants, computed once (each step used to recompute them from the geometry).
    _linear_flops: float = field(init=False, repr=False, compare=False)
    _attention_flops: float = field(init=False, repr=False, compare=False)
    _window_flops: float = field(init=False, repr=False, compare=False)
    _window_kv_bytes: float = field(init=False, repr=False, compare=False)
    _kv_bytes: float = field(init=False, repr=False, compare=False)
    _weight_bytes: float = field(init=False, repr=False, compare=False)
    _flops_rate: float = field(init=False, repr=False, compare=False)
    _bw_rate: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        g, hw, tp = self.geometry, self.hardware, self.hardware.num_devices
        # Attention FLOPs per attended token of the full layers, and per token in the sliding ones' windows.
        window = float(g.sliding_window or 0)
        per_context = g.attention_flops_per_token(window + 1) - g.attention_flops_per_token(window)
        constants = {
            "_linear_flops": g.linear_flops_per_token(),
            "_attention_flops": per_context,
            "_window_flops": g.attention_flops_per_token(window) - window * per_context,
            "_window_kv_bytes": g.window_kv_bytes(self.kv_dtype, int(window)),
            "_kv_bytes": g.kv_bytes_per_token(self.kv_dtype),
            "_weight_bytes": g.weight_bytes(self.weight_dtype),
            "_flops_rate": tp * hw.device.flops(self.weights),
            "_bw_rate": tp * hw.device.effective_bw,
        }
        for name, value in constants.items():
            object.__setattr__(self, name, value)

    @property
    def weights(self) -> str:
        """The dtype the step's matmuls run in (the checkpoint's dense layers', or the override)."""
        return self.weight_dtype or self.geometry.weight_dtype

    @property
    def pricing(self) -> str:
        """What prices a step, for a run's output: measured kernels (whose) or the roofline."""
        if self.kernels is None:
            return "roofline"
        t = self.kernels.tables
        return f"measured {t.backend} kernels on {t.gpu}"

    @property
    def kv_bytes_per_token(self) -> float:
        return self.geometry.kv_bytes_per_token(self.kv_dtype)

    def step(self, work: Iterable[Span], decode_starts: Sequence[int] = ()) -> StepCost:
        """The time of one engine step computing `work` (prefill chunks and decodes together), plus one
        decode token per sequence at each of `decode_starts` (spans [s, s + 1), summed without a loop).

        Every sum here is of integers or halves of integers, exact in a float far beyond any step's size, so
        the order in which spans are added (and adding the decodes as one integer sum) changes no bit."""
        tokens = attn_ctx = kv_read = decode_context = prefill_s = 0.0
        seqs = longest_query = longest_context = decodes = 0
        kernels = self.kernels
        for w in work:
            n = w.end - w.start
            tokens += n
            attn_ctx += n * (w.start + w.end + 1) / 2  # sum of (p + 1) for p in [start, end)
            kv_read += w.end
            seqs += 1
            longest_query, longest_context = max(longest_query, n), max(longest_context, w.end)
            if kernels is not None:  # a one-token span runs the decode kernel
                if n == 1:
                    decodes, decode_context = decodes + 1, decode_context + w.end
                elif n > 1:
                    prefill_s += kernels.prefill_seconds(w.start, w.end)
        if decode_starts:
            k, total = len(decode_starts), sum(decode_starts) + len(decode_starts)  # sum of (s + 1)
            tokens, attn_ctx, kv_read, seqs = tokens + k, attn_ctx + total, kv_read + total, seqs + k
            longest_query, longest_context = max(longest_query, 1), max(longest_context, max(decode_starts) + 1)
            decodes, decode_context = decodes + k, decode_context + total
        return StepCost(
            *self._parts(
                tokens,
                attn_ctx,
                kv_read,
                seqs,
                longest_query,
                longest_context,
                decodes=decodes,
                decode_context=decode_context,
                prefill_s=prefill_s,
            )
        )

    def decode_seconds(self, num_seqs: int, starts_sum: int, longest_start: int, steps: int = 1) -> list[float]:
        """`step((), starts).seconds` for `steps` decode steps in a row of `num_seqs` sequences whose decode
        starts sum to `starts_sum` and reach `longest_start` in the first, each one position further in every
        next step: the same floats, computed at once without a list of starts (a run of decode steps)."""
        if self.kernels is not None and num_seqs > 0:
            return self._kernel_decode_run(num_seqs, starts_sum, steps)
        j = np.arange(steps, dtype=np.int64)
        total = (starts_sum + num_seqs + num_seqs * j).astype(np.float64)  # sum of (s + 1), as `step` adds it
        seconds = self._parts(
            float(num_seqs),
            total,
            total,
            num_seqs,
            1,
            longest_start + 1 + j,
            np.maximum,
            decodes=num_seqs,
            decode_context=total,
        )[0]
        return np.broadcast_to(seconds, (steps,)).tolist()

    def _kernel_decode_run(self, num_seqs: int, starts_sum: int, steps: int) -> list[float]:
        """`decode_seconds` under measured kernels: each step's seconds as `step` computes them, one scalar
        lookup per step (a run is a few steps: numpy's per-call overhead on short arrays cost more than the
        lookups; the roofline's FLOPs and bytes, which a kernel-priced run's seconds do not read, are skipped)."""
        k, overhead = self.kernels, self.hardware.step_overhead_s
        linear = k.linear_seconds(num_seqs, num_seqs)
        first = starts_sum + num_seqs  # the first step's sum of (s + 1), as `step` adds it
        return [linear + k.decode_seconds(num_seqs, float(first + num_seqs * j)) + 0.0 + overhead for j in range(steps)]

    def _parts(
        self,
        tokens: float,
        attn_ctx,
        kv_read,
        seqs: int,
        longest_query: int,
        longest_context,
        maximum=max,
        decodes: int = 0,
        decode_context=0.0,
        prefill_s: float = 0.0,
    ) -> tuple:
        """StepCost's fields, in its order. `attn_ctx`, `kv_read`, `longest_context` and `decode_context` may
        be arrays (one step each, with `maximum=np.maximum`): numpy does the same IEEE operations, element by
        element. `decodes` of the sequences decode (contexts summing to `decode_context`); `prefill_s` is the
        measured attention of the others (both only read with kernel tables)."""
        g, hw = self.geometry, self.hardware
        if tokens == 0:
            return (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        if self.padded_attention:
            context = -(-longest_context // self.page_size) * self.page_size
            attn_ctx, kv_read = seqs * longest_query * context, seqs * context
        flops = tokens * (self._linear_flops + self._window_flops) + self._attention_flops * attn_ctx
        nbytes = self._weight_bytes_touched(tokens) + (kv_read + tokens) * self._kv_bytes + seqs * self._window_kv_bytes
        tp = hw.num_devices
        compute = flops / self._flops_rate
        memory = nbytes / self._bw_rate
        comm = 0.0
        if tp > 1:
            per = 2 * (tp - 1) / tp * tokens * g.hidden_size * ACTIVATION_BYTES / hw.device.interconnect_bw
            comm = 2 * g.num_layers * (per + hw.device.interconnect_latency_s)
        if self.kernels is not None:
            k = self.kernels
            busy = k.linear_seconds(int(tokens), seqs) + k.decode_seconds(decodes, decode_context) + prefill_s
            return (busy + hw.step_overhead_s, flops, nbytes, compute, memory, comm)
        busy = maximum(compute, memory) if hw.device.overlap else compute + memory
        return (busy + comm + hw.step_overhead_s, flops, nbytes, compute, memory, comm)

    def _weight_bytes_touched(self, tokens: float) -> float:
        g = self.geometry
        total = self._weight_bytes
        if g.moe is None:
            return total
        m = g.moe
        # Expected distinct experts per MoE layer when `tokens` tokens each pick top_k of num_experts.
        touched = m.num_experts * (1 - (1 - m.top_k / m.num_experts) ** tokens)
        per_expert = g.expert_weight_bytes_per_layer(self.weight_dtype)
        return total - m.num_layers * (m.num_experts - touched) * per_expert

    # ---- tiers -------------------------------------------------------------------------------------------
    def link(self, tier: Tier) -> Link:
        hw = self.hardware
        if tier == Tier.HOST:
            return Link("host", hw.host_bw, hw.host_link.latency_s)
        if tier == Tier.DISK:
            return hw.disk
        if tier in (Tier.REMOTE, Tier.PEER):
            return hw.network
        raise ValueError(f"tier {tier!r}: the device tier has no transfer link")

    def transfer_seconds(self, tier: Tier, tokens: int) -> float:
        """Seconds to move `tokens` tokens of KV between the device and `tier` (through the host)."""
        return self.restore_seconds({tier: tokens})

    def restore_seconds(self, tokens_by_tier: Mapping[Tier, int]) -> float:
        """A pipelined restore of KV held in lower tiers: every byte but a peer's crosses host -> device; bytes
        on disk or remote first cross their own link to the host; a peer's cross the network straight into
        device memory (RDMA, as NIXL pulls them). Stages overlap chunk by chunk."""
        kvb = self.kv_bytes_per_token
        to_device = sum(k for t, k in tokens_by_tier.items() if t not in (Tier.DEVICE, Tier.PEER))
        stages = [(self.link(Tier.HOST), to_device)] if to_device > 0 else []
        stages += [
            (self.link(t), k) for t, k in tokens_by_tier.items() if t in (Tier.DISK, Tier.REMOTE, Tier.PEER) and k > 0
        ]
        if not stages:
            return 0.0
        times = [k * kvb / link.bandwidth for link, k in stages]
        chunk = [min(k, RESTORE_CHUNK_TOKENS) * kvb / link.bandwidth for link, k in stages]
        slowest = max(range(len(times)), key=times.__getitem__)
        fill = sum(c for i, c in enumerate(chunk) if i != slowest)
        return times[slowest] + fill + sum(link.latency_s for link, _ in stages)
