"""Our row kernel against torch's linears, per SmolLM2-135M weight shape and row count: GB/s of weights read.

    python benchmarks/linear_rows.py [--rows 1,2,4,8] [--threads 2] [--repeats 60]

A decode step of a few rows reads every weight once, so its linears are bound by memory bandwidth: each shape
here is timed over enough copies of its weight (>= 64 MB) that every call reads from memory, not the cache.
Columns: `F.linear`, oneDNN's prepacked weights (`torch.ops.mkldnn._linear_pointwise`, what steps of more rows
use), and `cpu_kernels.linear_rows`; the largest difference from a float64 reference. What sets
`llama.ROW_KERNEL_ROWS` (per CPU capability) and `ROW_KERNEL_HEAD_ROWS`. This is a benchmark (it prints a
table), not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kvbench.engines.kvengine.model import cpu_kernels  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def median_s(call, weights: list[torch.Tensor], repeats: int) -> float:
    call(weights[0])
    times = []
    for index in range(repeats):
        weight = weights[index % len(weights)]
        started = time.perf_counter()
        call(weight)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    if not cpu_kernels.has_linear_rows():
        parser.error("the row kernel is not built here (no C compiler, KVBENCH_CPU_CODEC=0, or no AVX2+FMA)")
    torch.set_num_threads(args.threads)
    pack = torch.ops.mkldnn._reorder_linear_weight
    table = Table(
        title=f"linears of a few rows, GB/s of weights read ({args.threads} threads, "
        f"{torch.backends.cpu.get_cpu_capability()})"
    )
    for column in ("rows", "weight", "shape", "F.linear", "oneDNN prepacked", "row kernel", "max |diff|"):
        table.add_column(column, justify="right")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (n, k) in SHAPES.items():
            weights = [torch.randn(n, k) for _ in range(max(2, int(64e6 // (n * k * 4))))]
            packed = {w.data_ptr(): pack(w, 8) for w in weights}
            x = torch.randn(rows, k)
            calls = (
                lambda w: F.linear(x, w),
                lambda w: torch.ops.mkldnn._linear_pointwise(x, packed[w.data_ptr()], None, "none", [], ""),
                lambda w: cpu_kernels.linear_rows(x, w, None, args.threads),
            )
            rates = [n * k * 4 / median_s(call, weights, args.repeats) / 1e9 for call in calls]
            diff = (
                (
                    cpu_kernels.linear_rows(x, weights[0], None, args.threads).double()
                    - x.double() @ weights[0].double().T
                )
                .abs()
                .max()
                .item()
            )
            table.add_row(str(rows), name, f"{n}x{k}", *(f"{r:.1f}" for r in rates), f"{diff:.1e}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
