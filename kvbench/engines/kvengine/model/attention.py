"""Attention that reads the whole context through the page table.

Callers write the chunk's K/V into the cache first (`PagedKVCache.write`), then call an attention backend,
so that the model sees exactly the decoded values a later request sharing those pages will see.

Backends with one contract, `prepare(batch)` once per forward and `__call__(q, cache, layer, prepared)` per
layer:
- `ReferenceAttention`: one sequence at a time, whole pages decoded through torch's casts
  (`PagedKVCache.read`), `scaled_dot_product_attention` with an explicit causal-with-offset mask. Slow and
  obvious: the oracle.
- `VarlenAttention` (the engine's): a packed ("varlen") layout. Only each sequence's live tokens are
  gathered, fp8 decoded in the gather (`PagedKVCache.gather`: one C pass on CPU), into buffers allocated once
  per forward; then one SDPA call per sequence with no padding and no mask where none is needed (a decode row
  sees every key; a prompt from position 0 is plain causal). A chunk that continues a computed prefix gets
  its own small [q, k] mask. Per-sequence calls beat one padded call (measured in
  benchmarks/attention_bench.py): padding makes every sequence pay for the longest and the dense mask keeps
  SDPA off its flash kernel.
- `PaddedAttention`: all sequences padded to the longest page table in one SDPA call with a dense
  [B, 1, Qmax, Kmax] mask: the first fast path, kept as the benchmark's comparison point.
Every fast path is tested against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
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


class PaddedAttention:
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


@dataclass(frozen=True)
class SeqSpan:
    """One sequence in the packed layout: its queries q[q_start : q_start + q_len], its keys
    k[k_start : k_start + k_len] (positions 0..k_len-1), and the mask it needs (None: none or causal)."""

    q_start: int
    q_len: int
    k_start: int
    k_len: int
    causal: bool  # a prompt from position 0: SDPA's is_causal (top-left aligned) is exactly right
    mask: torch.Tensor | None  # [q_len, k_len] bool for a chunk after a computed prefix


@dataclass(slots=True)
class VarlenLayout:
    """Packed layout of a batch: the flat slots of every sequence's live tokens, and per-sequence spans.

    `buffers` (k, v [sum k_len, H, D] in the compute dtype) are allocated by the first layer's gather and
    refilled by every later layer: one allocation per forward, not per layer."""

    slots: torch.Tensor  # [sum k_len] int64
    spans: tuple[SeqSpan, ...]
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None


class VarlenAttention:
    """Packed per-sequence attention over only the live tokens; equal to `ReferenceAttention` up to rounding."""

    def prepare(self, batch: ForwardBatch, *, decodes: bool = True) -> VarlenLayout:
        """The packed layout of the batch's sequences (without its decode rows when `decodes` is False: a
        kernel backend attends those itself)."""
        ps = batch.page_size
        offsets = np.arange(ps, dtype=np.int64)
        slots, spans, k_start = [np.zeros(0, dtype=np.int64)], [], 0
        for start, qlen, computed, table in zip(
            batch.query_starts, batch.query_lens, batch.num_computed_tokens, batch.page_tables
        ):
            if qlen == 1 and not decodes:
                continue
            total = computed + qlen
            pages = np.asarray(table[: -(-total // ps)], dtype=np.int64)
            slots.append((pages[:, None] * ps + offsets[None, :]).reshape(-1)[:total])
            mask = None
            if qlen > 1 and computed > 0:  # query i sits at position computed + i and sees keys 0..computed + i
                q_pos = torch.arange(computed, total)
                mask = (torch.arange(total)[None, :] <= q_pos[:, None]).to(batch.device)
            spans.append(SeqSpan(start, qlen, k_start, total, qlen > 1 and computed == 0, mask))
            k_start += total
        flat = torch.from_numpy(np.concatenate(slots)).to(batch.device)
        return VarlenLayout(flat, tuple(spans))

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        out = torch.empty_like(q)
        self.attend(q, cache, layer, cast(VarlenLayout, prepared), out)
        return out

    @staticmethod
    def attend(q: torch.Tensor, cache: PagedKVCache, layer: int, layout: VarlenLayout, out: torch.Tensor) -> None:
        """Write the attention of the layout's spans into their rows of `out`."""
        if not layout.spans:
            return
        k, v = cache.gather(layer, layout.slots, out=layout.buffers)
        layout.buffers = (k, v)
        hq, hkv = q.shape[1], k.shape[1]
        # 4-D [1, heads, tokens, D] views: 3-D inputs take a slower SDPA path on CPU (measured: 1.5x)
        for s in layout.spans:
            ks = k[s.k_start : s.k_start + s.k_len].transpose(0, 1)[None]  # [1, Hkv, k_len, D]
            vs = v[s.k_start : s.k_start + s.k_len].transpose(0, 1)[None]
            qs = q[s.q_start : s.q_start + s.q_len]
            if s.q_len == 1:
                # one query sees every key: fold the query heads of each kv head into its query rows (GQA
                # without repeating K/V), no mask
                o = F.scaled_dot_product_attention(qs.view(1, hkv, hq // hkv, -1), ks, vs)
                out[s.q_start] = o.reshape(hq, -1)
                continue
            mask = None if s.mask is None else s.mask[None, None]
            o = F.scaled_dot_product_attention(
                qs.transpose(0, 1)[None], ks, vs, attn_mask=mask, is_causal=s.causal, enable_gqa=True
            )
            out[s.q_start : s.q_start + s.q_len] = o[0].transpose(0, 1)
