"""Paged attention per layer call: the padded path, the packed (varlen) path and the reference, per KV format.

    python benchmarks/attention_bench.py [--batch 8] [--context 256] [--prompt 512] [--threads 1] [--device cpu]

One decode step of `--batch` sequences with ragged contexts (context .. 1.25 x context tokens), one prefill
chunk continuing a cached prefix and one prompt of `--prompt` tokens from position 0, on SmolLM2-135M's
attention geometry (9 query heads, 3 KV heads, 64 dims), pages scattered over the cache. Prints ms per layer
call (best of `--repeats`) of the reference, padded and varlen backends and of our C kernels
(`CpuPagedAttention`, "-" where they do not apply), and the speed-ups padded / varlen and varlen / kernels.
A benchmark (it prints a table), not a test.
"""

from __future__ import annotations

import argparse
import time

import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model.attention import PaddedAttention, ReferenceAttention, VarlenAttention
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.cpu_attention import CpuPagedAttention, applies
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache

SMOLLM2_ONE_LAYER = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=1,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
)
FORMATS = [("fp32", None), ("bf16", None), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "channel"), ("fp8_e5m2", "tensor")]


def batches(batch: int, context: int, prompt: int, page_size: int, num_pages: int) -> dict[str, ForwardBatch]:
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(num_pages - 1, generator=gen) + 1
    chunks, used = [], 0
    for i in range(batch):
        computed = context + (i * context) // (4 * max(batch - 1, 1))
        pages = -(-(computed + 1) // page_size)
        chunks.append(SequenceChunk([1], computed, order[used : used + pages].tolist()))
        used += pages
    prefill = SequenceChunk([1] * 128, context, order[used : used + -(-(context + 128) // page_size)].tolist())
    used += -(-(context + 128) // page_size)
    whole = SequenceChunk([1] * prompt, 0, order[used : used + -(-prompt // page_size)].tolist())
    return {
        f"decode b={batch}": ForwardBatch.build(chunks, page_size),
        "prefill 128 after context": ForwardBatch.build([prefill], page_size),
        f"prompt of {prompt}": ForwardBatch.build([whole], page_size),
    }


def best_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    c, page_size = SMOLLM2_ONE_LAYER, 16
    num_pages = (8 * args.batch * args.context + args.prompt) // page_size + 64
    print(f"ms per layer call, {args.threads} thread(s), device {args.device}, best of {args.repeats}")
    print(
        f"{'batch':<28}{'format':<18}{'reference':>10}{'padded':>9}{'varlen':>9}{'kernels':>9}"
        f"{'padded/varlen':>15}{'varlen/kernels':>16}"
    )
    for name, batch in batches(args.batch, args.context, args.prompt, page_size, num_pages).items():
        batch = ForwardBatch.build(
            [
                SequenceChunk(batch.input_ids[s : s + n].tolist(), c0, t)
                for s, n, c0, t in zip(
                    batch.query_starts, batch.query_lens, batch.num_computed_tokens, batch.page_tables
                )
            ],
            page_size,
            device=args.device,
        )
        q = torch.randn(len(batch.input_ids), c.num_heads, c.head_dim, device=args.device)
        for fmt_names in FORMATS:
            fmt = KVFormat.parse(*fmt_names)
            cache = PagedKVCache(c, num_pages, page_size, fmt, args.device)
            slots = torch.arange(num_pages * page_size, device=args.device)
            cache.write(
                0, slots, *(torch.randn(len(slots), c.num_kv_heads, c.head_dim, device=args.device) for _ in range(2))
            )
            row = {}
            backends = [
                ("reference", ReferenceAttention()),
                ("padded", PaddedAttention()),
                ("varlen", VarlenAttention()),
            ]
            if applies(args.device, fmt, torch.float32):
                backends.append(("kernels", CpuPagedAttention()))
            for label, backend in backends:
                with torch.inference_mode():
                    prepared = backend.prepare(batch)
                    row[label] = best_ms(lambda: backend(q, cache, 0, prepared), args.repeats)
            kernels = f"{row['kernels']:>9.2f}" if "kernels" in row else f"{'-':>9}"
            ratio = f"{row['varlen'] / row['kernels']:>15.1f}x" if "kernels" in row else f"{'-':>16}"
            print(
                f"{name:<28}{fmt.label:<18}{row['reference']:>10.2f}{row['padded']:>9.2f}{row['varlen']:>9.2f}"
                f"{kernels}{row['padded'] / row['varlen']:>14.1f}x{ratio}"
            )


if __name__ == "__main__":
    main()
