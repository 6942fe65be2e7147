"""What re-gathering a prompt's prefix for every prefill chunk costs, against the chunk's attention itself.

    python benchmarks/engine_chunk_gather.py [--prompt 1024] [--chunks 32,128,512] [--threads 1]

`VarlenAttention` gathers (fp32: `index_select`; fp8: the C decode of `cpu_kernels`) every key a chunk attends,
the computed prefix included, once per layer. A prompt prefilled in chunks of C tokens beside decodes therefore
gathers ~prompt^2 / (2C) keys per layer instead of `prompt`. Per chunk size, for one layer of SmolLM2-135M's
geometry (3 KV heads of 64, 9 query heads): the prompt's total gather time (K and V, every chunk's whole
prefix), the part that is re-gathering (what a kept prefix would save), and the prompt's total chunk attention
(SDPA of each chunk over its prefix, with the causal-with-offset mask the engine builds). Multiply by 30 layers
for the model. A benchmark, not a test: under load its times are the load's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from kvbench.engines.kvengine.model import cpu_kernels

KV_HEADS, Q_HEADS, HEAD_DIM, POOL_TOKENS = 3, 9, 64, 16384


def timed(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def gather_ms(fp8: bool, slots: torch.Tensor) -> float:
    rows = torch.randn(POOL_TOKENS, KV_HEADS, HEAD_DIM)
    out = torch.empty(len(slots), KV_HEADS, HEAD_DIM)
    if fp8:
        codes, scale = rows.to(torch.float8_e4m3fn), torch.tensor(0.5)
        if cpu_kernels.library() is None:
            raise SystemExit("cpu_kernels: the C decode is not built here; run on a machine with a C compiler")
        return 2 * timed(lambda: cpu_kernels.decode(codes, slots, scale, None, out))
    return 2 * timed(lambda: torch.index_select(rows, 0, slots, out=out))  # K and V


def prompt_row(prompt: int, chunk: int, slots: torch.Tensor) -> dict[str, float]:
    row = {"fp32": 0.0, "fp8": 0.0, "attention": 0.0}
    for start in range(0, prompt, chunk):
        total = min(start + chunk, prompt)
        for name in ("fp32", "fp8"):
            row[name] += gather_ms(name == "fp8", slots[:total])
        q = torch.randn(1, Q_HEADS, total - start, HEAD_DIM)
        k, v = torch.randn(2, 1, KV_HEADS, total, HEAD_DIM)
        mask = None if start == 0 else (torch.arange(total)[None, :] <= torch.arange(start, total)[:, None])[None, None]
        row["attention"] += timed(
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=start == 0, enable_gqa=True),
            repeats=3,
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--chunks", default="32,128,512")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    slots = torch.randperm(POOL_TOKENS)[: args.prompt].sort().values
    once = {name: gather_ms(name == "fp8", slots) for name in ("fp32", "fp8")}
    table = Table(title=f"one layer, a {args.prompt}-token prompt prefilled in chunks ({args.threads} thread(s)); ms")
    for column in ("chunk", "gather fp32", "of it re-gather", "gather fp8", "of it re-gather", "chunk attention"):
        table.add_column(column, justify="right")
    for chunk in (int(c) for c in args.chunks.split(",")):
        row = prompt_row(args.prompt, chunk, slots)
        table.add_row(
            str(chunk),
            f"{row['fp32']:.2f}",
            f"{row['fp32'] - once['fp32']:.2f}",
            f"{row['fp8']:.2f}",
            f"{row['fp8'] - once['fp8']:.2f}",
            f"{row['attention']:.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
