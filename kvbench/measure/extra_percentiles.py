"""Percentiles a summary does not hold (it keeps 50, 90, 95 and 99), computed for the console table from the
per-request export (`requests_metrics.jsonl`): `--metric-percentiles 99.9` as vLLM accepts any 0 < p < 100.

The samples are the summary's own: measured (not warm-up), completed requests of the same point and tenant,
ITL as every request's gaps together, percentiles by linear interpolation (`distribution.PERCENTILE_METHOD`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from kvbench.distribution import PERCENTILE_METHOD

ALL_TENANTS = "all"


def percentile_column(metric: str, p: float) -> str:
    """The summary frame's column of `metric` (ttft, tpot, itl, e2e) at `p`, e.g. ttft_p99.9_ms."""
    return f"{metric}_p{p:g}_ms"


def add_percentiles(frame: pd.DataFrame, rows: Iterable[Mapping], columns: Sequence[str]) -> pd.DataFrame:
    """`frame` (a summary frame: run_id, tenant) with each of `columns` (`percentile_column`'s names) it lacks,
    from the export's `rows`; a point without samples gets None (missing, not 0)."""
    wanted = [_parse(column) for column in columns if column not in frame]
    if not wanted:
        return frame
    samples: dict[tuple[str, str, str], list[float]] = {}
    for row in rows:
        if row.get("warmup") or not row.get("ok"):
            continue
        for metric in {metric for metric, _ in wanted}:
            value = row.get(f"{metric}_ms")
            values = value if isinstance(value, list) else [] if value is None else [value]
            for tenant in {ALL_TENANTS, row.get("tenant")}:
                samples.setdefault((row["run_id"], tenant, metric), []).extend(values)
    frame = frame.copy()
    for metric, p in wanted:
        frame[percentile_column(metric, p)] = [
            _percentile(samples.get((run_id, tenant, metric), ()), p)
            for run_id, tenant in zip(frame["run_id"], frame["tenant"])
        ]
    return frame


def _parse(column: str) -> tuple[str, float]:
    metric, _, rest = column.partition("_p")
    return metric, float(rest.removesuffix("_ms"))


def _percentile(values: Sequence[float], p: float) -> float | None:
    return (
        float(np.percentile(np.asarray(values, dtype=np.float64), p, method=PERCENTILE_METHOD)) if len(values) else None
    )
