"""The memory budget at start: what one device will hold (weights, KV, the activation peak of a step), computed
from the model's config and the settings before anything is allocated, against what it may hold.

    limit   = memory_utilization x free memory of one device at start (host RAM available, on cpu)
    needed  = ranks sharing that memory x (weights + KV + activations)      (cpu: every rank; cuda: one)
    weights = this rank's parameters x compute dtype bytes                   (a meta-device model: no bytes)
              + its linear weights once more where they are prepacked (prepacked_weights, cpu fp32)
    KV      = pages of kv_capacity x page_size x this rank's KV bytes per token
    kv_capacity auto: the most pages that leave needed <= limit

`plan_memory` is pure (ints in, a frozen result out; meta tensors only), so it runs on a 72B config.json
without weights; `fit_memory` refuses a budget that does not fit with one line naming the setting to change,
and `free_device_bytes` is the one measurement, made by whoever starts the engine.

Activations are an estimate of one step's peak per rank (the largest live tensors of a layer, not a profile):

    hidden    T x hidden x 4 values          (residual, norm output, attention output, sum)
    qkv       T x (q + 2 kv heads) x head_dim
    mlp       T x intermediate x 3           (gate, up, their product)
    attention S x L x kv heads x head_dim x 2 (one layer's K/V of the batch decoded to the compute dtype)
              + T x q heads x L x 4 bytes    (fp32 scores of the step's queries over a whole context)
    logits    S x (vocab / ranks + vocab) x 4 bytes   (this rank's part, the gathered whole)

with T = max_step_tokens, S = max_num_seqs, L = the context length, in the compute dtype unless fp32 is said.
Not counted: prompt logprobs (T x vocab rows of logits), the transient copy of a checkpoint while it loads, a
CUDA context and NCCL's buffers (what the fraction left by memory_utilization is for).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.llama import LlamaForCausalLM, can_prepack, prepacked_bytes
from kvbench.engines.kvengine.model.parallel import TensorParallel
from kvbench.engines.kvengine.runtime.model_runner import TORCH_COMPUTE_DTYPES, capacity_pages
from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig
from kvbench.settings import SettingsError

GB = 1e9


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes of one rank at start, and the limit of the memory it shares with `ranks_per_memory` ranks."""

    weights: int
    kv: int
    activations: int
    kv_tokens: int  # the device KV tier, in tokens (without the null page)
    kv_bytes_per_token: int  # of this rank's KV heads
    ranks_per_memory: int  # ranks on one memory: all of them on cpu (host RAM), one per cuda device
    free: int  # free bytes of that memory at start
    utilization: float

    @property
    def per_rank(self) -> int:
        return self.weights + self.kv + self.activations

    @property
    def needed(self) -> int:
        return self.ranks_per_memory * self.per_rank

    @property
    def limit(self) -> int:
        return int(self.free * self.utilization)

    @property
    def fits(self) -> bool:
        return self.needed <= self.limit

    def describe(self) -> str:
        share = f"{self.ranks_per_memory} ranks x " if self.ranks_per_memory > 1 else ""
        return (
            f"{share}(weights {self.weights / GB:.2f} GB + KV {self.kv / GB:.2f} GB for {self.kv_tokens:,} "
            f"tokens + activations {self.activations / GB:.2f} GB) = {self.needed / GB:.2f} GB of "
            f"memory_utilization {self.utilization:g} x {self.free / GB:.2f} GB free = {self.limit / GB:.2f} GB"
        )


def activation_bytes(local: ModelConfig, vocab_rows: int, config: EngineConfig, context: int, dtype_bytes: int) -> int:
    """One step's activation peak on one rank (`local`: the rank's geometry, `vocab_rows` its part of the
    vocabulary); the formula is the module's."""
    t, s = config.max_step_tokens, config.max_num_seqs
    d = local.head_dim
    hidden = t * local.hidden_size * 4
    qkv = t * (local.num_heads + 2 * local.num_kv_heads) * d
    mlp = t * local.intermediate_size * 3
    kv_read = s * context * local.num_kv_heads * d * 2
    scores = t * local.num_heads * context * 4  # fp32
    logits = s * (vocab_rows + local.vocab_size) * 4  # fp32: this rank's part, then the gathered whole
    return (hidden + qkv + mlp + kv_read) * dtype_bytes + scores + logits


def plan_memory(model_config: ModelConfig, config: EngineConfig, free_bytes: int) -> MemoryBudget:
    """The budget of one rank of `config` on `model_config` with `free_bytes` free; `kv_capacity: auto` gets the
    most pages that fit (0 tokens when nothing is left for KV: `fit_memory` refuses that)."""
    parallel = TensorParallel(0, config.tensor_parallel_size)
    parallel.check(model_config)
    dtype = TORCH_COMPUTE_DTYPES[config.compute_dtype]
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config, parallel=parallel)
    local = model.config
    weights = sum(p.numel() for p in model.parameters()) * dtype.itemsize  # a tied LM head counts once
    if config.prepacked_weights and can_prepack(config.device, dtype):
        weights += prepacked_bytes(model)  # oneDNN's copies of the linear weights (LlamaForCausalLM.prepack)
    per_token = PagedKVCache(local, 1, config.page_size, config.kv_format, "meta", compute_dtype=dtype).bytes_per_token
    context = config.max_model_len or model_config.max_position_embeddings
    activations = activation_bytes(local, parallel.vocab_rows(model_config), config, context, dtype.itemsize)
    ranks_per_memory = config.tensor_parallel_size if not config.device.startswith("cuda") else 1
    page_bytes = config.page_size * per_token
    if config.kv_capacity == AUTO and config.kv_capacity_bytes is None:
        room = int(free_bytes * config.memory_utilization) // ranks_per_memory - weights - activations
        pages = max(room // page_bytes, 1)  # the null page included
    else:
        pages = capacity_pages(config, per_token)
    return MemoryBudget(
        weights,
        pages * page_bytes,
        activations,
        (pages - 1) * config.page_size,
        per_token,
        ranks_per_memory,
        free_bytes,
        config.memory_utilization,
    )


def fit_memory(model_config: ModelConfig, config: EngineConfig, free_bytes: int) -> tuple[EngineConfig, MemoryBudget]:
    """`config` with `kv_capacity: auto` replaced by the tokens that fit, and its budget; SettingsError (one
    line: the numbers and the setting to change) when the budget does not fit."""
    try:
        budget = plan_memory(model_config, config, free_bytes)
    except ValueError as exc:  # the model does not split over tensor_parallel_size
        raise SettingsError(str(exc)) from None
    auto = config.kv_capacity == AUTO and config.kv_capacity_bytes is None
    if budget.fits and budget.kv_tokens >= config.page_size:
        resolved = dataclasses.replace(config, kv_capacity=budget.kv_tokens) if auto else config
        return resolved, budget
    without_kv = budget.ranks_per_memory * (budget.weights + budget.activations)
    if without_kv + budget.ranks_per_memory * 2 * config.page_size * budget.kv_bytes_per_token > budget.limit:
        fix = (
            f"weights and activations alone leave no room for KV: raise tensor_parallel_size (now "
            f"{config.tensor_parallel_size}) or memory_utilization, or lower max_num_seqs (now "
            f"{config.max_num_seqs}), max_step_tokens or max_model_len"
        )
    else:
        room = budget.limit // budget.ranks_per_memory - budget.weights - budget.activations
        most = (room // (config.page_size * budget.kv_bytes_per_token) - 1) * config.page_size
        fix = (
            f"lower kv_capacity to at most {most:,} tokens (or kv_capacity: auto), or raise "
            f"tensor_parallel_size (now {config.tensor_parallel_size})"
        )
    raise SettingsError(f"memory budget on {config.device}: {budget.describe()}; {fix}")


def free_device_bytes(device: str) -> int:
    """Free memory of `device` now: torch's free bytes of a CUDA device, or the host RAM available (psutil)."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    import psutil

    return int(psutil.virtual_memory().available)
