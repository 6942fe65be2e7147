"""Tensor parallelism (Megatron-style, as vLLM shards Llama): which slice of every weight a rank holds, and the
collectives a sharded forward needs.

    weight (HF name)                 split                       after the matmul
    embed_tokens                     vocab rows (padded)         masked lookup, all-reduce (sum)
    q_proj / k_proj / v_proj (+bias) output: q heads / kv heads  -            (column parallel)
    o_proj                           input: q heads              all-reduce   (row parallel)
    gate_proj / up_proj              output: intermediate        -            (column parallel)
    down_proj                        input: intermediate         all-reduce   (row parallel)
    lm_head (tied or not)            vocab rows (padded)         all-gather, padding cut
    norms                            replicated

KV heads: each rank holds `num_kv_heads / size` of them when that divides; with more ranks than KV heads
(`size` a multiple of `num_kv_heads`) each rank holds the one KV head its query heads read, replicated on
`size / num_kv_heads` ranks, as vLLM does. A rank's `local_config` is the geometry it computes (its heads, its
part of the MLP; the full vocabulary, which the gathered logits have), so the KV cache, attention and
calibration of a rank run unchanged on it. `TensorParallel()` (size 1) is the null object: every collective
returns its input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from kvbench.engines.kvengine.model.config import ModelConfig

SETTING = "tensor_parallel_size"  # the engine setting that names the number of ranks (messages name it)

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # split on the output (dim 0)
_ROW = ("o_proj", "down_proj")  # split on the input (dim 1)
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class Cut:
    """The slice [start, stop) of dimension `dim` of a full weight that one rank holds; `rows`, when larger than
    the slice, pads it with zeros (the last rank's share of a vocabulary that does not divide)."""

    dim: int
    start: int
    stop: int
    rows: int

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of `full` (contiguous, padded)."""
        return self.pad(full.narrow(self.dim, self.start, self.stop - self.start))

    def pad(self, part: torch.Tensor) -> torch.Tensor:
        missing = self.rows - part.shape[self.dim]
        if missing > 0:
            shape = list(part.shape)
            shape[self.dim] = missing
            part = torch.cat([part, part.new_zeros(shape)], dim=self.dim)
        return part.contiguous()


class Collectives(Protocol):
    """How the ranks exchange tensors: every rank calls each method in the same order with the same shapes."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` summed, into `x` (the same bits on every rank)."""
        ...

    def concat(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x`, concatenated along the last dimension in rank order (a new tensor)."""
        ...


@dataclass(frozen=True)
class DistributedCollectives:
    """Collectives over a torch.distributed process group (None: the default one): NCCL on CUDA, gloo on CPU."""

    group: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        torch.distributed.all_reduce(x, group=self.group)
        return x

    def concat(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size(self.group))]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


@dataclass(frozen=True)
class TensorParallel:
    """Rank `rank` of `size` ranks of one model; `collectives` carry the exchanges (the default: the default
    torch.distributed process group; `server/shm_collectives.py` has a faster one for CPU ranks on one host)."""

    rank: int = 0
    size: int = 1
    collectives: Collectives = DistributedCollectives()

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not one of the {self.size} ranks of {SETTING}")

    # ---- geometry --------------------------------------------------------------------------------------------
    def check(self, config: ModelConfig) -> None:
        """ValueError naming the setting when `config` cannot be split over `size` ranks."""
        n = self.size
        if config.num_heads % n:
            raise ValueError(f"{SETTING} {n} must divide the model's {config.num_heads} attention heads")
        if config.num_kv_heads % n and n % config.num_kv_heads:
            raise ValueError(
                f"{SETTING} {n} must divide the model's {config.num_kv_heads} KV heads or be a multiple of them"
            )
        if config.intermediate_size % n:
            raise ValueError(f"{SETTING} {n} must divide the model's MLP size {config.intermediate_size}")

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The geometry this rank computes: its query and KV heads, its part of the MLP, the full vocabulary."""
        self.check(config)
        return dataclasses.replace(
            config,
            num_heads=config.num_heads // self.size,
            num_kv_heads=max(config.num_kv_heads // self.size, 1),
            intermediate_size=config.intermediate_size // self.size,
        )

    def vocab_rows(self, config: ModelConfig) -> int:
        """Rows of this rank's embedding and LM head: ceil(vocab / size), equal on every rank."""
        return -(-config.vocab_size // self.size)

    def vocab_start(self, config: ModelConfig) -> int:
        return self.rank * self.vocab_rows(config)

    def _kv_head_start(self, config: ModelConfig) -> int:
        """The first KV head this rank holds: its own share, or (replicated) the head its query heads read."""
        if config.num_kv_heads % self.size == 0:
            return self.rank * (config.num_kv_heads // self.size)
        return self.rank // (self.size // config.num_kv_heads)

    def cut(self, name: str, config: ModelConfig) -> Cut | None:
        """This rank's slice of the full Hugging Face weight `name`; None: it is replicated."""
        local = self.local_config(config)
        d = config.head_dim
        if name in _VOCAB:
            rows = self.vocab_rows(config)
            start = min(self.vocab_start(config), config.vocab_size)
            return Cut(0, start, min(start + rows, config.vocab_size), rows)
        parts = name.split(".")
        if len(parts) < 2 or parts[-2] not in _COLUMN + _ROW:
            return None
        module = parts[-2]
        if module in ("q_proj", "o_proj"):
            start, width = self.rank * local.num_heads * d, local.num_heads * d
        elif module in ("k_proj", "v_proj"):
            start, width = self._kv_head_start(config) * d, local.num_kv_heads * d
        else:
            start, width = self.rank * local.intermediate_size, local.intermediate_size
        dim = 1 if module in _ROW else 0
        if parts[-1] == "bias" and dim == 1:
            return None  # a row-parallel bias is added once, after the sum (Llama's have none)
        return Cut(dim, start, start + width, width)

    def shard_state_dict(self, state: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
        """This rank's part of a full state dict (every weight cut, replicated ones as they are)."""
        if self.size == 1:
            return dict(state)
        out = {}
        for name, tensor in state.items():
            cut = self.cut(name, config)
            out[name] = tensor if cut is None else cut.take(tensor)
        return out

    # ---- collectives -----------------------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x` (the output of a row-parallel layer), in place."""
        return self.collectives.all_reduce(x) if self.size > 1 else x

    def embed(self, weight: torch.Tensor, ids: torch.Tensor, config: ModelConfig) -> torch.Tensor:
        """Embedding lookup over vocabulary-sharded rows: each rank looks up the ids it holds, zeros elsewhere,
        and the sum over ranks is every id's row."""
        if self.size == 1:
            return F.embedding(ids, weight)
        local = ids - self.vocab_start(config)
        held = (local >= 0) & (local < weight.shape[0])
        out = F.embedding(local.clamp(0, weight.shape[0] - 1), weight)
        return self.all_reduce(out.masked_fill(~held[:, None], 0))

    def gather_vocab(self, logits: torch.Tensor, config: ModelConfig) -> torch.Tensor:
        """Logits [n, vocab] from every rank's [n, vocab_rows] (all-gather, the padding cut off)."""
        if self.size == 1:
            return logits
        return self.collectives.concat(logits)[..., : config.vocab_size]


SINGLE = TensorParallel()
