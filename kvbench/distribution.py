"""The one summary-of-samples type used for every metric (TTFT, ITL, TPOT, E2E, lags)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

PERCENTILE_METHOD = "linear"  # numpy's default; vLLM's and SGLang's benchmark clients compute the same way
PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Distribution:
    """Count, mean, std, min, max and p50/p90/p95/p99 (linear interpolation) of a sample, in its own unit."""

    n: int
    mean: float
    std: float
    min: float
    max: float
    p50: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> "Distribution | None":
        """The distribution of `values`, or None when there are none (missing is not zero)."""
        array = np.asarray(values, dtype=np.float64)
        if array.size == 0:
            return None
        p50, p90, p95, p99 = np.percentile(array, PERCENTILES, method=PERCENTILE_METHOD)
        return cls(
            n=int(array.size),
            mean=float(array.mean()),
            std=float(array.std()),
            min=float(array.min()),
            max=float(array.max()),
            p50=float(p50),
            p90=float(p90),
            p95=float(p95),
            p99=float(p99),
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)
