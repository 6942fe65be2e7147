"""The context length past which FP8 KV decodes faster than BF16: where their per-step cost lines cross.

A decode step's attention reads each sequence's KV once, so its time is close to a line in the context:

    t(context) = intercept + slope * context

FP8 halves the bytes a token reads (a smaller slope) but its kernels dequantize and rescale (FlashAttention-3
also quantizes the query), a fixed cost a step pays whatever the context (a larger intercept). FP8 is slower
below the crossing and faster past it:

    break-even = (intercept_fp8 - intercept_bf16) / (slope_bf16 - slope_fp8)

The GEMMs of a step do not depend on the KV dtype, so the crossing of the attention costs is the crossing
of whole decode steps. Measured costs are not exactly lines (a kernel changes its split at some lengths), so
the break-even reported is `crossing`: the first context where the priced FP8 cost stops exceeding BF16's,
linear between the two measured contexts around it. The fitted lines (`fit_line`, `break_even`) stay for the
description of the two costs. Pure arithmetic: `capacity.fp8_break_even` prices the rows from kernel tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Line:
    """Seconds as a line in the context: `intercept_s + slope_s * context`."""

    intercept_s: float
    slope_s: float  # seconds per context token

    def at(self, context: float) -> float:
        return self.intercept_s + self.slope_s * context


def fit_line(contexts: Sequence[float], seconds: Sequence[float]) -> Line:
    """The least-squares line through measured (context, seconds) points."""
    slope, intercept = np.polyfit(np.asarray(contexts, dtype=np.float64), np.asarray(seconds, dtype=np.float64), 1)
    return Line(float(intercept), float(slope))


def break_even(bf16: Line, fp8: Line) -> float | None:
    """The context past which `fp8` is faster than `bf16` (0.0: at every context); None when it never gets
    faster as the context grows (its slope is not smaller and its intercept not lower)."""
    if fp8.slope_s < bf16.slope_s:
        return max(0.0, (fp8.intercept_s - bf16.intercept_s) / (bf16.slope_s - fp8.slope_s))
    return 0.0 if fp8.slope_s == bf16.slope_s and fp8.intercept_s < bf16.intercept_s else None


def crossing(contexts: Sequence[float], bf16_s: Sequence[float], fp8_s: Sequence[float]) -> float | None:
    """The context where FP8's cost first stops exceeding BF16's, linear between the measured `contexts`
    (increasing) around the sign change; 0.0 when FP8 is no slower at the first, None when it is slower at all."""
    gaps = [f - b for b, f in zip(bf16_s, fp8_s, strict=True)]
    if not gaps:
        return None
    if gaps[0] <= 0:
        return 0.0
    for (c0, g0), (c1, g1) in zip(zip(contexts, gaps), zip(contexts[1:], gaps[1:])):
        if g1 <= 0:
            return float(c0 + (c1 - c0) * g0 / (g0 - g1))
    return None


@dataclass(frozen=True, slots=True)
class BreakEven:
    """The lines of one batch size and where the priced costs cross (`crossing`; None: FP8 never faster)."""

    batch: int
    bf16: Line
    fp8: Line
    context: float | None

    @classmethod
    def of(cls, batch: int, contexts: Sequence[float], bf16_s: Sequence[float], fp8_s: Sequence[float]) -> BreakEven:
        return cls(batch, fit_line(contexts, bf16_s), fit_line(contexts, fp8_s), crossing(contexts, bf16_s, fp8_s))

    def describe(self) -> str:
        where = (
            "never, at any context"
            if self.context is None
            else "at every context"
            if self.context == 0
            else f"past {self.context:,.0f} tokens of context"
        )
        return (
            f"batch {self.batch}: FP8 KV decodes faster than BF16 {where} (per step, fitted: BF16 "
            f"{self.bf16.intercept_s * 1e6:.1f} us + {self.bf16.slope_s * 1e9:.2f} us/1K tokens, FP8 "
            f"{self.fp8.intercept_s * 1e6:.1f} us + {self.fp8.slope_s * 1e9:.2f} us/1K tokens)"
        )
