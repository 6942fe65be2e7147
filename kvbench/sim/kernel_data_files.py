"""Where the shipped kernel tables live and what they hold: one owner for their names and columns.

The tables are slices of aiconfigurator-core 0.12.0's measured per-op latencies (Apache-2.0, NVIDIA), cut by
benchmarks/extract_kernel_tables.py; `kernel_tables.load_kernel_tables` reads them. Latencies are in ms; an all-reduce's
`message_size` counts elements (aiconfigurator's comm ops factor an element count), not bytes.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from kvbench.sim.geometry import ModelGeometry
from kvbench.sim.kernel_cost import StepKernels
from kvbench.sim.kernel_tables import GemmTable, KernelTables

DATA_DIR = Path(__file__).with_name("kernel_data")
# Our hardware profiles' device names -> aiconfigurator's system names.
GPUS = {"h100": "h100_sxm", "h200": "h200_sxm"}
# The engine versions whose kernels were measured.
BACKEND_VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
_ATTENTION = (
    "batch_size",
    "isl",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "kv_cache_dtype",
    "step",
    "window_size",
    "latency",
)
TABLE_COLUMNS = {
    "generation_attention": _ATTENTION,
    "context_attention": _ATTENTION,
    "gemm": ("gemm_dtype", "m", "n", "k", "latency"),
    "moe": ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "latency"),
    "allreduce": ("num_gpus", "message_size", "latency"),
}


def table_path(gpu: str, backend: str, table: str) -> Path:
    """`gpu` is aiconfigurator's system name (h200_sxm)."""
    return DATA_DIR / f"{gpu}-{backend}-{table}.csv.gz"


@functools.cache
def load_kernel_tables(device: str, backend: str) -> KernelTables | None:
    """The shipped tables of a hardware profile's device (`h200`) and an engine (`vllm`), read once per
    process; None for a device or engine they do not cover (the cost model keeps its roofline there)."""
    gpu = GPUS.get(device)
    if gpu is None or backend not in BACKEND_VERSIONS:
        return None

    def read(table: str) -> pd.DataFrame | None:
        path = table_path(gpu, backend, table)
        return pd.read_csv(path) if path.is_file() else None

    gemm = read("gemm")
    return KernelTables(
        gpu,
        backend,
        read("generation_attention"),
        read("context_attention"),
        {dtype: GemmTable.from_frame(rows) for dtype, rows in gemm.groupby("gemm_dtype")},
        read("moe"),
        read("allreduce"),
    )


@functools.lru_cache(maxsize=64)
def step_kernels(
    geometry: ModelGeometry, device: str, tp: int, backend: str | None, kv_dtype: str, weight_dtype: str | None
) -> StepKernels | None:
    """The measured kernels of `geometry` on `tp` x `device` under `backend`, built once per setting (its
    curves and their caches are shared by every cost model of that setting); None: the roofline prices it."""
    tables = load_kernel_tables(device, backend) if backend is not None else None
    return None if tables is None else StepKernels.for_model(tables, geometry, tp, kv_dtype, weight_dtype)
