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
               keeps the roofline); decode by (batch, context): each measured batch's context curve (past its
               last measured context, along its last slope), linear in batch between the two around it;
               prefill by the batch-1 curve over the prompt length, and past its last measured length
               (16K tokens) quadratic in the length from that point (`PrefillAttention`: causal attention
               over L tokens does L^2 / 2 work; the line through the last two points priced a 32K prefill
               at 0.65x this and a 128K one at 0.19x)
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MS = 1e-3


@dataclass(frozen=True, slots=True)
class Curve:
    """Latency (s) measured at increasing points `x`; `at` interpolates (module docstring)."""

    x: np.ndarray
    seconds: np.ndarray
    # The same points as Python floats, for `at` on one number (a step prices a few each: numpy's per-call
    # overhead would be most of the simulator's pricing time).
    _xs: list[float] = field(init=False, repr=False, compare=False)
    _ys: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_xs", self.x.tolist())
        object.__setattr__(self, "_ys", self.seconds.tolist())

    def at(self, x):
        """The latency at `x` (a number or an array of them)."""
        xs, ys = self._xs, self._ys
        if isinstance(x, (int, float)):
            i = bisect.bisect_left(xs, x)
            if i == 0 or len(xs) < 2:
                return ys[0] if i == 0 or x <= xs[0] else ys[-1]
            i = min(i, len(xs) - 1)  # past the last point: the line through the last two
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        y = np.interp(x, self.x, self.seconds)
        if len(xs) < 2:
            return y
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return np.where(np.asarray(x) > xs[-1], ys[-1] + slope * (np.asarray(x) - xs[-1]), y)

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
            for i, wl in ((k_lo, 1 - wk), (k_hi, wk)):
                w = wj * wl
                if w == 0:
                    continue
                total += w * self.seconds[:, j, i] * (n * k) / (self.n[j] * self.k[i])
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
    """Generation attention of one shape: a context curve per measured batch size. The tables stop where a
    batch's KV would not fit (batch x context of about 256K tokens), so a large batch's curve ends early
    and `Curve.at` carries on along its last measured slope (the KV read grows linearly with the context)."""

    batch: np.ndarray
    curves: tuple[Curve, ...]

    def for_batch(self, batch: int) -> Curve:
        """The context curve at `batch` sequences: linear between the measured batches around it, at the
        contexts either measured (and past the largest batch, the largest's per-sequence cost times `batch`)."""
        if batch >= self.batch[-1]:
            return self.curves[-1].scaled(batch / self.batch[-1])
        hi = int(np.searchsorted(self.batch, batch))
        if self.batch[hi] == batch or hi == 0:
            return self.curves[hi]
        w = (batch - self.batch[hi - 1]) / (self.batch[hi] - self.batch[hi - 1])
        lo, up = self.curves[hi - 1], self.curves[hi]
        contexts = np.union1d(lo.x, up.x)
        return Curve(contexts, (1 - w) * lo.at(contexts) + w * up.at(contexts))


@dataclass(frozen=True, slots=True)
class PrefillAttention:
    """Context attention of one sequence over its prompt length L: the measured curve up to its last length
    L_n, and past it `latency(L_n) * (L / L_n)^2` (its work grows as L^2; module docstring)."""

    curve: Curve

    def at(self, tokens: float) -> float:
        last = self.curve._xs[-1]
        if tokens <= last:
            return self.curve.at(tokens)
        return self.curve._ys[-1] * (tokens / last) ** 2


def _shape_rows(frame: pd.DataFrame, shape: AttentionShape) -> pd.DataFrame:
    return frame[
        (frame["num_heads"] == shape.heads)
        & (frame["num_key_value_heads"] == shape.kv_heads)
        & (frame["head_dim"] == shape.head_dim)
        & (frame["window_size"] == shape.window)
        & (frame["kv_cache_dtype"] == shape.kv_dtype)
    ]


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
        batches = sorted(rows["batch_size"].unique())
        return DecodeAttention(
            np.array(batches, dtype=np.float64), tuple(curve(rows[rows["batch_size"] == b], "step") for b in batches)
        )

    def prefill_attention(self, shape: AttentionShape) -> PrefillAttention | None:
        """Context attention of `shape` for one sequence over its prompt length, or None where unmeasured."""
        rows = _shape_rows(self.context_attention, shape)
        rows = rows[rows["batch_size"] == 1]
        return None if rows.empty else PrefillAttention(curve(rows, "isl"))

    def gemm_curve(self, dtype: str, n: int, k: int) -> Curve | None:
        table = self.gemm.get(dtype)
        return None if table is None else table.curve(n, k)

    def moe_curve(self, dtype: str, hidden: int, inter: int, topk: int, experts: int, tp: int) -> Curve | None:
        """Fused MoE (all experts of one layer, tensor-parallel over `tp`) over tokens; None where unmeasured."""
        if self.moe is None:
            return None
        m = self.moe
        rows = m[
            (m["moe_dtype"] == dtype)
            & (m["hidden_size"] == hidden)
            & (m["inter_size"] == inter)
            & (m["topk"] == topk)
            & (m["num_experts"] == experts)
            & (m["moe_tp_size"] == tp)
        ]
        return None if rows.empty else curve(rows, "num_tokens")

    def allreduce_curve(self, gpus: int) -> Curve | None:
        rows = self.allreduce[self.allreduce["num_gpus"] == gpus]
        return None if rows.empty else curve(rows, "message_size")
