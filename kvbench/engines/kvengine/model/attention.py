"""Attention that reads the whole context through the page table.

Callers write the chunk's K/V into the cache first (`PagedKVCache.write`), then call an attention backend,
so that the model sees exactly the decoded values a later request sharing those pages will see.

Two backends with one contract, `prepare(batch)` once per forward and `__call__(q, cache, layer, prepared)`
per layer:
- `ReferenceAttention`: one sequence at a time, gather pages, `scaled_dot_product_attention` with an explicit
  causal-with-offset mask. Slow and obvious: the oracle.
- `BatchedAttention`: all sequences padded into one SDPA call (what decode steps use); tested against the
  reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn.functional as F

from kvbench.engines.kvengine.model.batch import ForwardBatch
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache


class AttentionBackend(Protocol):
    """Paged attention: q [n, Hq, D] of the batch's new tokens -> output [n, Hq, D]."""

    def prepare(self, batch: ForwardBatch) -> object:
        """Per-forward layout shared by every layer (index tensors, masks)."""
        ...

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor: ...


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, Lq, Hq, D], k/v [B, Lk, Hkv, D], mask [B, 1, Lq, Lk] bool -> [B, Lq, Hq, D]."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True
    )
    return out.transpose(1, 2)


class ReferenceAttention:
    """Per-sequence gather + SDPA; the oracle for faster backends."""

    def prepare(self, batch: ForwardBatch) -> ForwardBatch:
        return batch

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        batch = cast(ForwardBatch, prepared)
        out = torch.empty_like(q)
        for start, qlen, computed, table in zip(
            batch.query_starts, batch.query_lens, batch.num_computed_tokens, batch.page_tables
        ):
            total = computed + qlen
            pages = torch.tensor(table, dtype=torch.int64, device=q.device)
            k, v = cache.read(layer, pages)
            k, v = k[:total], v[:total]
            # query i sits at absolute position computed + i and sees keys 0..computed + i
            q_pos = torch.arange(computed, total, device=q.device)
            mask = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]
            o = _attend(q[None, start : start + qlen], k[None], v[None], mask[None, None])
            out[start : start + qlen] = o[0]
        return out


@dataclass(frozen=True)
class BatchedLayout:
    """Padded layout of a batch: B sequences x Qmax queries over Kmax = max_pages * page_size keys."""

    page_table: torch.Tensor  # [B, max_pages] int64, padded with page 0 (masked out)
    query_index: torch.Tensor  # [B, Qmax] rows of the flat token axis (padding points at row 0)
    query_valid: torch.Tensor  # [B, Qmax] bool
    mask: torch.Tensor  # [B, 1, Qmax, Kmax] bool


class BatchedAttention:
    """All sequences in one padded SDPA call; equal to `ReferenceAttention` up to float rounding."""

    def prepare(self, batch: ForwardBatch) -> BatchedLayout:
        dev = batch.device
        B = batch.num_seqs
        max_pages = max(len(t) for t in batch.page_tables)
        q_max = max(batch.query_lens)
        table = torch.zeros(B, max_pages, dtype=torch.int64)
        for i, t in enumerate(batch.page_tables):
            table[i, : len(t)] = torch.tensor(t, dtype=torch.int64)
        starts = torch.tensor(batch.query_starts, dtype=torch.int64)
        lens = torch.tensor(batch.query_lens, dtype=torch.int64)
        computed = torch.tensor(batch.num_computed_tokens, dtype=torch.int64)
        offs = torch.arange(q_max)
        valid = offs[None, :] < lens[:, None]
        index = torch.where(valid, starts[:, None] + offs[None, :], torch.zeros((), dtype=torch.int64))
        q_pos = computed[:, None] + offs[None, :]  # [B, Qmax] absolute positions
        keys = torch.arange(max_pages * batch.page_size)
        mask = keys[None, None, :] <= q_pos[:, :, None]
        # padded query rows attend key 0 only: a fully masked row would make SDPA return NaN
        mask = mask & valid[:, :, None] | (~valid[:, :, None] & (keys == 0)[None, None, :])
        return BatchedLayout(table.to(dev), index.to(dev), valid.to(dev), mask[:, None].to(dev))

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        layout = cast(BatchedLayout, prepared)
        k, v = cache.read(layer, layout.page_table)  # [B, Kmax, Hkv, D]
        o = _attend(q[layout.query_index], k, v, layout.mask)  # [B, Qmax, Hq, D]
        out = torch.empty_like(q)
        out[layout.query_index[layout.query_valid]] = o[layout.query_valid]
        return out
