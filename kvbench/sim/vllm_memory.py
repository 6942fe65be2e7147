"""vLLM's KV-cache memory arithmetic: how many KV tokens a vLLM replica gets on its devices.

vLLM (v1, `gpu_worker.determine_available_memory`, `utils.request_memory`, `kv_cache_utils`) per device:

    requested  = ceil(total_memory * gpu_memory_utilization)
    available  = requested - (weights + peak activation + non-torch memory)      # the profiled non-KV memory
    num_blocks = available // bytes_per_block          bytes_per_block = layers * block_size * KV bytes/token/device
    KV tokens  = (min over the TP ranks of num_blocks - 1) * block_size         # block 0 is the null block

Weights and KV heads are split over the tensor-parallel ranks. vLLM measures the peak activation and the
non-torch memory by running a dummy forward pass of `max_num_batched_tokens` tokens and a dummy sampler pass of
`max_num_seqs` sequences; without a GPU they are estimated here (`activation_estimate`), and both estimates can be
overridden. CUDA graph memory is not subtracted (vLLM only does so with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.sim.geometry import ModelGeometry

GIB = 2**30
ACTIVATION_BYTES = 2  # bf16 activations
LOGIT_BYTES = 4  # the sampler's float32 logits
SAMPLER_COPIES = 3  # logits, probabilities and the sorted copy top-p/top-k keep at once (an estimate)
NON_TORCH_BYTES = 0.5 * GIB  # CUDA context beyond the allocator, cuBLAS workspaces (an estimate)
NON_TORCH_TP_BYTES = 1.0 * GIB  # NCCL and custom all-reduce buffers with tensor parallelism (an estimate)


@dataclass(frozen=True, slots=True)
class VllmMemory:
    """One replica's memory budget per device, as vLLM computes it, and the KV tokens it yields."""

    total_bytes: float
    requested_bytes: int
    weight_bytes: float
    activation_bytes: float
    non_torch_bytes: float
    bytes_per_block: float
    num_blocks: int
    block_size: int

    @property
    def available_kv_bytes(self) -> float:
        return self.requested_bytes - self.weight_bytes - self.activation_bytes - self.non_torch_bytes

    def check_fits(self, model: str, tp: int) -> None:
        """Raise one line with the sizes when the budget holds fewer than two blocks (vLLM's null block and one
        to use): the weights, or the weights and activations, do not fit."""
        if self.num_blocks >= 2:
            return
        what = "weights do not fit" if self.weight_bytes >= self.requested_bytes else "KV cache gets under 2 blocks"
        raise ValueError(
            f"{model} on {tp} device(s): the {what}: {self.requested_bytes / GIB:.1f} GiB requested per "
            f"device, weights {self.weight_bytes / GIB:.1f} GiB, activations {self.activation_bytes / GIB:.1f} "
            f"GiB, other {self.non_torch_bytes / GIB:.1f} GiB, a KV block {self.bytes_per_block / 2**20:.2f} "
            "MiB; use more devices (--tp), smaller weights (--weight-dtype fp8) or a higher "
            "--gpu-memory-utilization"
        )

    @property
    def kv_tokens(self) -> int:
        """Usable KV tokens of the replica (the null block left out)."""
        return max(self.num_blocks - 1, 0) * self.block_size


def activation_estimate(geometry: ModelGeometry, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Peak activation bytes per device of vLLM's profiling pass, estimated: the widest layer's tensors at
    `max_num_batched_tokens` tokens (the MLP's gate/up output and its product, plus a few hidden-size tensors)
    and the dummy sampler's logits for `max_num_seqs` sequences."""
    intermediate = geometry.intermediate_size / tp
    per_token = (3 * intermediate + 4 * geometry.hidden_size) * ACTIVATION_BYTES
    sampler = max_num_seqs * geometry.vocab_size * LOGIT_BYTES * SAMPLER_COPIES / tp
    return max_num_batched_tokens * per_token + sampler


def vllm_memory(
    geometry: ModelGeometry,
    device_memory_bytes: float,
    tp: int,
    gpu_memory_utilization: float,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    kv_dtype: str,
    weight_dtype: str | None = None,
    activation_bytes: float | None = None,
    non_torch_bytes: float | None = None,
) -> VllmMemory:
    """vLLM's budget for `geometry` on `tp` devices of `device_memory_bytes` (module docstring)."""
    if tp < 1 or geometry.num_kv_heads % tp and tp % geometry.num_kv_heads:
        raise ValueError(
            f"tensor parallel size {tp} does not divide {geometry.name}'s {geometry.num_kv_heads} KV heads"
        )
    requested = math.ceil(device_memory_bytes * gpu_memory_utilization)
    weights = geometry.weight_bytes(weight_dtype) / tp
    if activation_bytes is None:
        activation_bytes = activation_estimate(geometry, tp, max_num_batched_tokens, max_num_seqs)
    if non_torch_bytes is None:
        non_torch_bytes = NON_TORCH_BYTES + (NON_TORCH_TP_BYTES if tp > 1 else 0.0)
    # KV heads split over the ranks (replicated when there are more ranks than heads).
    kv_per_token = geometry.kv_bytes_per_token(kv_dtype) * max(geometry.num_kv_heads // tp, 1) / geometry.num_kv_heads
    bytes_per_block = kv_per_token * block_size
    available = requested - weights - activation_bytes - non_torch_bytes
    blocks = int(available // bytes_per_block) if available > 0 else 0
    return VllmMemory(
        device_memory_bytes, requested, weights, activation_bytes, non_torch_bytes, bytes_per_block, blocks, block_size
    )
