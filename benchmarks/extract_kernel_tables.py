"""Extract the slices of aiconfigurator-core's measured kernel tables the simulator prices steps with.

    pip install aiconfigurator-core==0.12.0   # 82 MB wheel, 112 MB installed, a compiled extension
    python benchmarks/extract_kernel_tables.py

writes kvbench/sim/kernel_data/<gpu>-<backend>-<table>.csv.gz (about 4 MB in all) from
aiconfigurator_core/systems/data/<gpu>/<op>/<backend>/<version>/*.parquet (Apache-2.0, NVIDIA), so a fresh
machine prices steps without the package. What is kept (module docstring of kvbench/sim/kernel_tables.py):
attention (FlashAttention-3 for vLLM and SGLang, TensorRT-LLM's own) at head dims 64 and 128, windows
0 (full) and 128 (gpt-oss) and the shipped models' heads per device; GEMMs, the fastest measured kernel per (dtype, m, n, k); fused MoE without expert
parallelism at aiconfigurator's default power-law routing; all-reduce, the fastest kernel per (gpus, bytes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from kvbench.sim.kernel_data_files import BACKEND_VERSIONS, GPUS, TABLE_COLUMNS, table_path

ATTENTION_KERNELS = {"vllm": "vllm_flash_attn_fa3", "sglang": "fa3", "trtllm": None}
HEAD_DIMS = (64, 128)
WINDOWS = (0, 128)
# Query heads per device of the shipped models at 1-8 way tensor parallelism (64 -> 8, Mixtral's 48 -> 6).
HEADS_PER_DEVICE = (4, 6, 8, 12, 16, 24, 32, 48, 64)
MOE_DISTRIBUTION = "power_law_1.01"


def _source(root: Path, gpu: str, op: str, backend: str, name: str) -> Path:
    return root / gpu / op / backend / BACKEND_VERSIONS[backend] / f"{name}.parquet"


def _attention(frame: pd.DataFrame, backend: str) -> pd.DataFrame:
    kernel = ATTENTION_KERNELS[backend]
    keep = (
        frame["head_dim"].isin(HEAD_DIMS)
        & frame["window_size"].isin(WINDOWS)
        & (frame["beam_width"] == 1)
        & frame["num_heads"].isin(HEADS_PER_DEVICE)
    )
    if kernel is not None:
        keep &= frame["kernel_source"] == kernel
    return frame[keep]


def _fastest(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return frame.groupby(keys, as_index=False)["latency"].min()


def extract(root: Path, gpu: str, backend: str) -> dict[str, pd.DataFrame]:
    tables = {}
    for table, (op, name) in {
        "generation_attention": ("attention", "generation_attention_perf"),
        "context_attention": ("attention", "context_attention_perf"),
    }.items():
        tables[table] = _attention(pd.read_parquet(_source(root, gpu, op, backend, name)), backend)
    gemm = pd.read_parquet(_source(root, gpu, "gemm", backend, "gemm_perf"))
    tables["gemm"] = _fastest(gemm, ["gemm_dtype", "m", "n", "k"])
    moe_path = _source(root, gpu, "moe", backend, "moe_perf")
    if moe_path.is_file():
        moe = pd.read_parquet(moe_path)
        moe = moe[(moe["moe_ep_size"] == 1) & (moe["distribution"] == MOE_DISTRIBUTION)]
        tables["moe"] = _fastest(
            moe, ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size"]
        )
    allreduce = pd.read_parquet(_source(root, gpu, "comm", backend, "custom_allreduce_perf"))
    tables["allreduce"] = _fastest(allreduce, ["num_gpus", "message_size"])
    return {name: frame[list(TABLE_COLUMNS[name])] for name, frame in tables.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, help="systems/data of an unpacked aiconfigurator-core (default: the installed one)"
    )
    args = parser.parse_args()
    if args.root is None:
        import aiconfigurator_core

        args.root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    for gpu in GPUS.values():
        for backend in BACKEND_VERSIONS:
            for table, frame in extract(args.root, gpu, backend).items():
                path = table_path(gpu, backend, table)
                frame.to_csv(path, index=False, float_format="%.4g", compression={"method": "gzip", "mtime": 0})
                print(f"{path}: {len(frame)} rows, {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
