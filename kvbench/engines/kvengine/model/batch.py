"""The input of one model forward: new tokens of several sequences, each with its page table.

For one sequence (page_size 4, num_computed_tokens 6, a chunk of 3 new tokens, page table [7, 2, 9]):

    position   0 1 2 3 | 4 5 6 7 | 8 9 . .
    page           7   |    2    |    9
    region     computed---->|new--->|free

"Computed" is vLLM's num_computed_tokens: K/V already in the pages, whether a prefix-cache hit or an
earlier chunk of this same sequence (the scheduler's num_cached_tokens counts only the first).

The new tokens' K/V go to slots page*page_size + position%page_size (here 2*4+2, 2*4+3, 9*4+0); attention
then reads positions 0..num_computed_tokens+len-1 back through the pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceChunk:
    """One sequence's part of a batch: the tokens to compute now and where its KV lives.

    `page_table` lists the page ids of positions 0.. in order; it must cover num_computed_tokens +
    len(token_ids).
    """

    token_ids: Sequence[int]
    num_computed_tokens: int
    page_table: Sequence[int]


@dataclass(frozen=True)
class ForwardBatch:
    """Concatenated new tokens of several sequences plus per-sequence layout; build with `ForwardBatch.build`.

    Tensors live on the model's device. `logit_rows` selects the rows whose logits the forward returns:
    the last new token of each sequence, or every new token when `all_logits` (prompt logprobs).
    """

    input_ids: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] int64
    slot_mapping: torch.Tensor  # [n] int64: page_id * page_size + offset where each new token's KV goes
    query_starts: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_computed_tokens: tuple[int, ...]  # per sequence: K/V already in its pages before this batch
    page_tables: tuple[tuple[int, ...], ...]
    page_size: int
    all_logits: bool
    logit_rows: torch.Tensor  # [m] int64 rows of the flat token axis

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @classmethod
    def build(
        cls,
        chunks: Sequence[SequenceChunk],
        page_size: int,
        *,
        all_logits: bool = False,
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        """Lay out `chunks` (at least one, each with at least one token) for a forward pass."""
        if not chunks:
            raise ValueError("chunks is empty: a ForwardBatch needs at least one sequence")
        if page_size <= 0:
            raise ValueError(f"page_size={page_size} must be positive")
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts, lens, computed, tables, last_rows = [], [], [], [], []
        for i, chunk in enumerate(chunks):
            n, c, table = len(chunk.token_ids), chunk.num_computed_tokens, tuple(int(p) for p in chunk.page_table)
            if n == 0:
                raise ValueError(f"chunks[{i}].token_ids is empty: send at least one new token per sequence")
            if c < 0:
                raise ValueError(f"chunks[{i}].num_computed_tokens={c} must be >= 0")
            if len(table) * page_size < c + n:
                raise ValueError(
                    f"chunks[{i}].page_table has {len(table)} pages of {page_size} tokens but the sequence "
                    f"needs {c + n} slots: allocate {-(-(c + n) // page_size) - len(table)} more pages"
                )
            starts.append(len(ids))
            lens.append(n)
            computed.append(c)
            tables.append(table)
            ids.extend(int(t) for t in chunk.token_ids)
            for pos in range(c, c + n):
                positions.append(pos)
                slots.append(table[pos // page_size] * page_size + pos % page_size)
            last_rows.append(len(ids) - 1)
        rows = list(range(len(ids))) if all_logits else last_rows

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(
            input_ids=as_tensor(ids),
            positions=as_tensor(positions),
            slot_mapping=as_tensor(slots),
            query_starts=tuple(starts),
            query_lens=tuple(lens),
            num_computed_tokens=tuple(computed),
            page_tables=tuple(tables),
            page_size=page_size,
            all_logits=all_logits,
            logit_rows=as_tensor(rows),
        )
