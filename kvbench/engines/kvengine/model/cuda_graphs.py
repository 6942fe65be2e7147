"""Decode steps replayed as CUDA graphs: launch overhead paid once per (batch, context) bucket, not per step.

    forward = DecodeGraphs(model, cache, max_batch, max_pages)   # or the model itself when the setting is off
    logits = forward(batch, cache)       # a decode-only batch replays a graph; anything else runs eagerly

A graph replays fixed shapes, so a decode batch is padded up to a bucket: batch sizes 1, 2, 4, ... up to
`max_batch`, page-table widths 1, 2, 4, ... up to `max_pages`. Padding rows decode token 0 into the null page
(page 0, which the engine never hands out) and their logits are dropped. Inside a graph, attention is
`GraphDecodeAttention`: every row gathers its page table's width of tokens (fp8 decoded in the gather,
as `PagedKVCache.gather` does) and masks keys past its length, one SDPA call for the batch; the bucket
bounds the padding to under 2x. Graphs are captured on first use of a bucket and share one memory pool.

CUDA only: `EngineConfig` refuses `cuda_graphs` on any other device. Checked against eager decode by the
`gpu`-marked tests (tests/engines/kvengine/model/test_model_gpu.py) that `ci/gpu-check.sh` runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvbench.engines.kvengine.model.batch import ForwardBatch
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.llama import LlamaForCausalLM

NULL_PAGE = 0  # the page the engine's pool never allocates (runtime/engine.py: "+ the null page")


def bucket(n: int, limit: int) -> int:
    """The smallest power of two >= n, capped at `limit` (n <= limit)."""
    return min(1 << max(n - 1, 0).bit_length(), limit)


@dataclass(frozen=True)
class GraphLayout:
    """The static inputs of one captured bucket, refilled before each replay."""

    page_table: torch.Tensor  # [B, P] int64
    context_lens: torch.Tensor  # [B] int64: keys each row sees (its position + 1)


class GraphDecodeAttention:
    """Static-shape paged decode attention (one query per row) for graph capture; see the module docstring."""

    def __init__(self, layout: GraphLayout) -> None:
        self.layout = layout

    def prepare(self, batch: ForwardBatch) -> GraphLayout:
        return self.layout

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, layer: int, prepared: object) -> torch.Tensor:
        layout = self.layout
        B, P = layout.page_table.shape
        ps = cache.page_size
        keys = P * ps
        offsets = torch.arange(ps, device=q.device)
        slots = (layout.page_table[:, :, None] * ps + offsets).reshape(-1)
        k, v = cache.gather(layer, slots)
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        k = k.view(B, keys, hkv, d).transpose(1, 2)
        v = v.view(B, keys, hkv, d).transpose(1, 2)
        mask = torch.arange(keys, device=q.device)[None, :] < layout.context_lens[:, None]
        o = F.scaled_dot_product_attention(q.view(B, hkv, hq // hkv, d), k, v, attn_mask=mask[:, None, None, :])
        return o.reshape(B, hq, d)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    batch: ForwardBatch  # its tensors are the graph's static inputs
    layout: GraphLayout
    logits: torch.Tensor  # the graph's static output [B, vocab]


class DecodeGraphs:
    """`forward(batch, cache)` with decode-only batches replayed from CUDA graphs (see the module docstring)."""

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, max_batch: int, max_pages: int) -> None:
        if cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the KV cache on a cuda device, not {cache.device}")
        self.model, self.cache = model, cache
        self.max_batch, self.max_pages = max_batch, max_pages
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle()

    def fits(self, batch: ForwardBatch) -> bool:
        """A decode step: one new token per sequence, last-token logits only, within the buckets."""
        return (
            not batch.all_logits
            and all(n == 1 for n in batch.query_lens)
            and batch.num_seqs <= self.max_batch
            and max(map(len, batch.page_tables)) <= self.max_pages
        )

    def __call__(self, batch: ForwardBatch, cache: PagedKVCache) -> torch.Tensor:
        if cache is not self.cache or not self.fits(batch):
            return self.model(batch, cache)
        n = batch.num_seqs
        pages = max(-(-(c + 1) // batch.page_size) for c in batch.num_computed_tokens)
        key = (bucket(n, self.max_batch), bucket(pages, self.max_pages))
        captured = self._graphs.get(key) or self._capture(*key)
        self._fill(captured, batch)
        captured.graph.replay()
        return captured.logits[:n].clone()

    def _fill(self, captured: _Captured, batch: ForwardBatch) -> None:
        n, static, layout = batch.num_seqs, captured.batch, captured.layout
        static.input_ids.zero_()
        static.positions.zero_()
        static.slot_mapping.fill_(NULL_PAGE * batch.page_size)
        static.input_ids[:n] = batch.input_ids
        static.positions[:n] = batch.positions
        static.slot_mapping[:n] = batch.slot_mapping
        width = layout.page_table.shape[1]
        table = torch.full(layout.page_table.shape, NULL_PAGE, dtype=torch.int64)
        for row, pages in enumerate(batch.page_tables):
            table[row, : min(len(pages), width)] = torch.tensor(pages[:width], dtype=torch.int64)
        layout.page_table.copy_(table, non_blocking=True)
        lens = torch.ones(layout.context_lens.shape, dtype=torch.int64)
        lens[:n] = torch.tensor(batch.num_computed_tokens, dtype=torch.int64) + 1
        layout.context_lens.copy_(lens, non_blocking=True)

    def _capture(self, size: int, width: int) -> _Captured:
        dev = self.cache.device

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=dev)

        batch = ForwardBatch(
            input_ids=zeros(size),
            positions=zeros(size),
            slot_mapping=zeros(size),
            query_starts=tuple(range(size)),
            query_lens=(1,) * size,
            num_computed_tokens=(0,) * size,
            page_tables=((NULL_PAGE,),) * size,
            page_size=self.cache.page_size,
            all_logits=False,
            logit_rows=torch.arange(size, device=dev),
        )
        layout = GraphLayout(zeros(size, width), torch.ones(size, dtype=torch.int64, device=dev))
        eager, self.model.attention = self.model.attention, GraphDecodeAttention(layout)
        try:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up outside the graph (lazy inits, allocator), as torch advises
                for _ in range(2):
                    self.model(batch, self.cache)
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self.model(batch, self.cache)
        finally:
            self.model.attention = eager
        captured = _Captured(graph, batch, layout, logits)
        self._graphs[(size, width)] = captured
        return captured
