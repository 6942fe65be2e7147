"""One rank's model and paged KV, and the device work the step loop asks of it, as messages.

The step loop (rank 0) decides; every rank carries out the same work on its own shard, in the same order:

    rank 0:   plan = scheduler.schedule()  ->  ranks.send(op)  ->  runner.execute(op)   (for each op of the step)
    rank r:   op = receive()                                   ->  runner.execute(op)

A `Forward` runs the model (its collectives meet across ranks: every rank must run the same ops); `SwapOut` /
`SwapIn` / `DropSwap` move a preempted request's pages to and from this rank's memory. Each rank's KV cache
holds its own KV heads' pages under the same page ids, so a plan's page ids mean the same on every rank.
With one rank, `Ranks()` sends to nobody.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.calibration import calibrate_kv_scales, calibration_token_ids
from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.gpu_attention import attention_for
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.loader import LoadedModel, load_model
from kvbench.engines.kvengine.model.parallel import SINGLE, TensorParallel
from kvbench.engines.kvengine.model.tiny import TINY_CONFIG
from kvbench.engines.kvengine.model.weights import resolve_source
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.settings.config import COMPUTE_DTYPES, EngineConfig

TINY_RANDOM = "tiny-random"  # a seeded random-weight model with a byte tokenizer, for fast end-to-end tests
TORCH_COMPUTE_DTYPES = {name: getattr(torch, name) for name in COMPUTE_DTYPES}


@dataclass(frozen=True)
class Forward:
    """Run the model over these chunks (K/V written into their pages)."""

    chunks: tuple[SequenceChunk, ...]
    all_logits: bool = False


@dataclass(frozen=True)
class SwapOut:
    """Keep a copy of a preempted request's pages (they may be reused by this very step)."""

    request_id: str
    pages: tuple[int, ...]


@dataclass(frozen=True)
class SwapIn:
    """Write a swapped request's copy back into (new) pages."""

    request_id: str
    pages: tuple[int, ...]


@dataclass(frozen=True)
class DropSwap:
    """Forget a swapped request's copy (it ended while swapped out)."""

    request_id: str


DeviceOp = Forward | SwapOut | SwapIn | DropSwap


@dataclass(frozen=True)
class ForwardResult:
    batch: ForwardBatch
    logits: torch.Tensor  # [len(batch.logit_rows), vocab] fp32, the same on every rank


def _nobody(op: DeviceOp) -> None:
    """The `send` of a single rank."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of one engine: its shard, and how the other ranks get each op
    (rank 0 only; the default sends to nobody)."""

    parallel: TensorParallel = SINGLE
    send: Callable[[DeviceOp], None] = _nobody


def rank_device(device: str, rank: int) -> str:
    """The device of rank `rank`: `cuda` (or `cuda:k`) counts up from the first device, `cpu` is shared."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return device
    return f"cuda:{int(index or 0) + rank}"


@dataclass
class ModelRunner:
    """A rank's model and KV pages; `execute` carries out one op. Not thread-safe."""

    model: torch.nn.Module
    kv_cache: PagedKVCache
    page_size: int
    device: str
    # The forward of a step: the model itself, or with cuda_graphs its decode steps replayed from graphs.
    forward: Callable[[ForwardBatch, PagedKVCache], torch.Tensor] | None = None
    swapped: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.forward is None:
            self.forward = self.model

    def execute(self, op: DeviceOp) -> ForwardResult | None:
        if isinstance(op, Forward):
            batch = ForwardBatch.build(op.chunks, self.page_size, all_logits=op.all_logits, device=self.device)
            return ForwardResult(batch, self.forward(batch, self.kv_cache))
        if isinstance(op, SwapOut):
            self.swapped[op.request_id] = self.kv_cache.read_pages(list(op.pages)).clone()
        elif isinstance(op, SwapIn):
            self.kv_cache.write_pages(list(op.pages), self.swapped.pop(op.request_id))
        elif isinstance(op, DropSwap):
            self.swapped.pop(op.request_id, None)
        else:
            raise TypeError(f"not a device op: {op!r}")
        return None


def model_config_of(config: EngineConfig) -> ModelConfig:
    """The geometry of the model `config` names, from its config.json alone (no weights are read)."""
    if config.model == TINY_RANDOM:
        return TINY_CONFIG
    return ModelConfig.from_folder(resolve_source(config.model))


def load_rank_model(config: EngineConfig, parallel: TensorParallel) -> LoadedModel:
    """The model `config` names on this rank's device in the compute dtype (this rank's shard of it)."""
    dtype = TORCH_COMPUTE_DTYPES[config.compute_dtype]
    device = rank_device(config.device, parallel.rank)
    if config.model == TINY_RANDOM:
        return tiny_loaded_model(device=device, dtype=dtype, parallel=parallel)
    return load_model(config.model, device=device, dtype=dtype, parallel=parallel)


def capacity_pages(config: EngineConfig, bytes_per_token: int) -> int:
    """Pages of the device KV tier, the null page included: `kv_capacity` tokens, or `kv_capacity_bytes` of
    this rank's KV (`bytes_per_token` of its own KV heads)."""
    if config.kv_capacity_bytes is not None:
        tokens = config.kv_capacity_bytes // bytes_per_token
    else:
        tokens = int(config.kv_capacity)
    return max(tokens // config.page_size, 1) + 1


def build_runner(config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype, device: str) -> ModelRunner:
    """The model's KV cache (calibrated scales for fp8: one forward, which every rank runs at start)."""
    model_config = loaded.model.config  # this rank's geometry
    fmt = config.kv_format
    probe = PagedKVCache(model_config, 1, config.page_size, fmt, "meta", compute_dtype=dtype)
    num_pages = capacity_pages(config, probe.bytes_per_token)
    scales = calibrate_kv_scales(loaded.model, calibration_token_ids(loaded.tokenizer), fmt)
    kv_cache = PagedKVCache(model_config, num_pages, config.page_size, fmt, device, scales=scales, compute_dtype=dtype)
    # Paged attention for this device and format: a kernel on CUDA where one is installed (model/gpu_attention.py).
    loaded.model.attention = attention_for(device, fmt, dtype)
    if config.prepacked_weights:
        loaded.model.prepack()  # no-op (0 bytes) off cpu fp32; memory_budget counted its bytes
    else:
        loaded.model.prepacked = None  # `loaded` may have served an engine that prepacked it
    forward = None
    if config.cuda_graphs:
        from kvbench.engines.kvengine.model.cuda_graphs import DecodeGraphs

        max_model_len = config.max_model_len or loaded.config.max_position_embeddings
        forward = DecodeGraphs(loaded.model, kv_cache, config.max_num_seqs, -(-max_model_len // config.page_size))
    return ModelRunner(loaded.model, kv_cache, config.page_size, device, forward)


def serve_ops(runner: ModelRunner, receive: Callable[[], DeviceOp | None]) -> None:
    """A worker rank's loop: carry out every op rank 0 sends, until it sends None (or its channel closes)."""
    while (op := receive()) is not None:
        runner.execute(op)


def chunks_of(chunks: Sequence[SequenceChunk]) -> tuple[SequenceChunk, ...]:
    """Chunks as plain values (token lists, page tuples), cheap to send to other ranks."""
    return tuple(SequenceChunk(list(c.token_ids), c.num_computed_tokens, tuple(c.page_table)) for c in chunks)


def is_device_error(exc: BaseException) -> bool:
    """An error of the device itself (a CUDA fault), after which no request can be computed."""
    device_error = getattr(torch, "AcceleratorError", None)  # torch >= 2.8
    return device_error is not None and isinstance(exc, device_error)


def model_digest(loaded: LoadedModel) -> str:
    """A short digest of the model's identity (config and a sample of its weights) for content keys."""
    h = hashlib.blake2b(repr(loaded.config).encode(), digest_size=8)
    first = next(loaded.model.parameters(), None)
    if first is not None:
        h.update(first.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()
