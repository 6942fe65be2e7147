"""Measured kernel latencies as lookups: a latency for any shape, interpolated between measured points.

Pure data and arithmetic (numpy, pandas frames in; no files: `kernel_data_files` loads them once). The tables
are aiconfigurator-core's per-op measurements (module docstring of `kernel_data_files`); every latency here is
in seconds (the files hold ms). How a shape between measured points is priced:

    curve      one measured axis (tokens, context, bytes): linear between the two nearest points, and past
               the last one along the line through the last two (a kernel past its largest measured size
               keeps its last per-unit cost)
    GEMM       (m, n, k): the m curve of each of the four measured (n, k) around the asked one, scaled by
               n * k / (n_j * k_l) (time per weight element), weighted bilinearly in log n and log k
    attention  exact heads, KV heads, head dim, window and KV dtype (no such row: `None`, and the caller
               keeps the roofline); decode by (batch, context): linear in batch between the measured batches,
               then the context curve; prefill by the batch-1 curve over the prompt length
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

MS = 1e-3


@dataclass(frozen=True, slots=True)
class Curve:
    """Latency (s) measured at increasing points `x`; `at` interpolates (module docstring)."""

    x: np.ndarray
    seconds: np.ndarray

    def at(self, x):
        """The latency at `x` (a number or an array)."""
        y = np.interp(x, self.x, self.seconds)
        if len(self.x) < 2:
            return y
        slope = (self.seconds[-1] - self.seconds[-2]) / (self.x[-1] - self.x[-2])
        return np.where(np.asarray(x) > self.x[-1], self.seconds[-1] + slope * (np.asarray(x) - self.x[-1]), y)

    def scaled(self, factor: float) -> Curve:
        return Curve(self.x, self.seconds * factor)


def curve(frame: pd.DataFrame, x: str) -> Curve:
    """The latency column of `frame` (ms) over its column `x`, one point per value (their mean)."""
    points = frame.groupby(x)["latency"].mean().sort_index()
    return Curve(points.index.to_numpy(dtype=np.float64), points.to_numpy(dtype=np.float64) * MS)


def _bracket(grid: np.ndarray, value: float) -> tuple[int, int, float]:
    """Indices of the grid points around `value` (clamped to the grid) and the weight of the upper one, in log."""
    hi = int(np.clip(np.searchsorted(grid, value), 1, len(grid) - 1)) if len(grid) > 1 else 0
    lo = max(hi - 1, 0)
    if hi == lo or value <= grid[lo]:
        return lo, lo, 0.0
    if value >= grid[hi]:
        return hi, hi, 0.0
    return lo, hi, float(np.log(value / grid[lo]) / np.log(grid[hi] / grid[lo]))


@dataclass(frozen=True, slots=True)
class GemmTable:
    """One GEMM dtype's measurements: latency[m, n, k] on the grid `m` x `n` x `k`."""

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    seconds: np.ndarray  # shape (len(m), len(n), len(k)); NaN where a point was not measured

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> GemmTable:
        cube = frame.pivot_table(index="m", columns=["n", "k"], values="latency", aggfunc="mean")
        m = cube.index.to_numpy(dtype=np.float64)
        n = np.unique(frame["n"].to_numpy(dtype=np.float64))
        k = np.unique(frame["k"].to_numpy(dtype=np.float64))
        full = cube.reindex(columns=pd.MultiIndex.from_product([n.astype(int), k.astype(int)]))
        return cls(m, n, k, full.to_numpy(dtype=np.float64).reshape(len(m), len(n), len(k)) * MS)

    def curve(self, n: int, k: int) -> Curve:
        """Latency over m of an (m x k) @ (k x n) GEMM, from the four measured (n, k) around it."""
        n_lo, n_hi, wn = _bracket(self.n, n)
        k_lo, k_hi, wk = _bracket(self.k, k)
        total = np.zeros(len(self.m))
        weight = 0.0
        for j, wj in ((n_lo, 1 - wn), (n_hi, wn)):
            for l, wl in ((k_lo, 1 - wk), (k_hi, wk)):
                w = wj * wl
                if w == 0:
                    continue
                total += w * self.seconds[:, j, l] * (n * k) / (self.n[j] * self.k[l])
                weight += w
        ok = np.isfinite(total)
        return Curve(self.m[ok], total[ok] / weight)


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What an attention kernel's latency is measured by, besides batch and length (per device, after TP)."""

    heads: int
    kv_heads: int
    head_dim: int
    window: int  # 0: full attention
    kv_dtype: str  # the tables' names: bfloat16, fp8


@dataclass(frozen=True, slots=True)
class DecodeAttention:
    """Generation attention of one shape: latency[batch, context] measured on the grid `batch` x `context`."""

    batch: np.ndarray
    context: np.ndarray
    seconds: np.ndarray

    def for_batch(self, batch: int) -> Curve:
        """The context curve at `batch` sequences: linear between the measured batches around it (and past the
        largest, the largest's per-sequence cost times `batch`)."""
        if batch >= self.batch[-1]:
            return Curve(self.context, self.seconds[-1] * batch / self.batch[-1])
        hi = int(np.searchsorted(self.batch, batch))
        if self.batch[hi] == batch or hi == 0:
            return Curve(self.context, self.seconds[hi])
        w = (batch - self.batch[hi - 1]) / (self.batch[hi] - self.batch[hi - 1])
        return Curve(self.context, (1 - w) * self.seconds[hi - 1] + w * self.seconds[hi])


def _shape_rows(frame: pd.DataFrame, shape: AttentionShape) -> pd.DataFrame:
    return frame[(frame["num_heads"] == shape.heads) & (frame["num_key_value_heads"] == shape.kv_heads)
                 & (frame["head_dim"] == shape.head_dim) & (frame["window_size"] == shape.window)
                 & (frame["kv_cache_dtype"] == shape.kv_dtype)]


@dataclass(frozen=True, slots=True)
class KernelTables:
    """One GPU's and one engine's measured kernels (what `kernel_data_files.load_kernel_tables` returns)."""

    gpu: str
    backend: str
    generation_attention: pd.DataFrame
    context_attention: pd.DataFrame
    gemm: Mapping[str, GemmTable]  # by the tables' gemm_dtype: bfloat16, fp8, fp8_block
    moe: pd.DataFrame | None
    allreduce: pd.DataFrame

    def decode_attention(self, shape: AttentionShape) -> DecodeAttention | None:
        """Generation attention of `shape` (the tables' `step` is the context), or None where unmeasured."""
        rows = _shape_rows(self.generation_attention, shape)
        if rows.empty:
            return None
        grid = rows.pivot_table(index="batch_size", columns="step", values="latency", aggfunc="mean")
        grid = grid.interpolate(axis=1, limit_direction="both")  # a batch not measured at every context
        return DecodeAttention(grid.index.to_numpy(dtype=np.float64), grid.columns.to_numpy(dtype=np.float64),
                               grid.to_numpy(dtype=np.float64) * MS)

    def prefill_attention(self, shape: AttentionShape) -> Curve | None:
        """Context attention of `shape` for one sequence over its prompt length, or None where unmeasured."""
        rows = _shape_rows(self.context_attention, shape)
        rows = rows[rows["batch_size"] == 1]
        return None if rows.empty else curve(rows, "isl")

    def gemm_curve(self, dtype: str, n: int, k: int) -> Curve | None:
        table = self.gemm.get(dtype)
        return None if table is None else table.curve(n, k)

    def moe_curve(self, dtype: str, hidden: int, inter: int, topk: int, experts: int, tp: int) -> Curve | None:
        """Fused MoE (all experts of one layer, tensor-parallel over `tp`) over tokens; None where unmeasured."""
        if self.moe is None:
            return None
        m = self.moe
        rows = m[(m["moe_dtype"] == dtype) & (m["hidden_size"] == hidden) & (m["inter_size"] == inter)
                 & (m["topk"] == topk) & (m["num_experts"] == experts) & (m["moe_tp_size"] == tp)]
        return None if rows.empty else curve(rows, "num_tokens")

    def allreduce_curve(self, gpus: int) -> Curve | None:
        rows = self.allreduce[self.allreduce["num_gpus"] == gpus]
        return None if rows.empty else curve(rows, "message_size")
