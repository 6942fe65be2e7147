"""Quality beside performance: a `kvbench run` folder's numbers next to this eval's, per KV setting.

kvbench run  -> RUN_DIR/summary.json (read by kvbench.measure.run_folder)  throughput, TTFT p99, hit rate,
                                                                          prefill recomputation
kvbench eval -> MetricRows                                               KL, top-1, deltas with intervals
-> one row per KV setting (matched by the KV format's label, "fp8_e4m3/tensor"): the trade-off a user
   decides on. A run point's setting missing from the eval (or the reverse) is shown with n/a, not dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kvbench.engines.kvengine.core.kv_format import DEFAULT_SCALE_MODE, KV_DTYPES, KVFormat
from kvbench.evals.tasks import TASKS
from kvbench.measure.report import summary_frame
from kvbench.measure.run_folder import RunEntry, read_run_folder

PERF_COLUMNS = ("output_tok_s", "ttft_p99_ms", "cache_hit_rate", "prefill_recompute_rate")


def run_label(entry: RunEntry) -> str:
    """The eval label of a run point's KV setting: from the settings it ran with (the scale mode defaulted as
    the engine defaults it), else the KV description the entry recorded (another engine's "auto (float32)")."""
    dtype = str(entry.engine_settings.get("kv_dtype", ""))
    if dtype in KV_DTYPES:
        return KVFormat.from_settings(dtype, str(entry.engine_settings.get("kv_scale", DEFAULT_SCALE_MODE.value))).label
    return entry.kv_dtype


def perf_by_setting(run_dir: Path, engine: str | None = None) -> dict[str, dict]:
    """Per KV setting label: the mean over the run's valid points (all tenants) of the performance columns,
    with the load points and workloads they came from; only `engine`'s points when it is given."""
    folder = read_run_folder(run_dir)
    entries = [e for e in folder.entries if engine is None or e.engine_name in (engine, None)]
    labels = {entry.run_id: run_label(entry) for entry in entries}
    frame = summary_frame(entries)
    frame = frame[(frame["tenant"] == "all") & (frame["valid"] != False)]  # noqa: E712 (a missing flag is not False)
    out: dict[str, dict] = {}
    for run_id, group in frame.groupby("run_id"):
        label = labels[run_id]
        row = out.setdefault(label, {"points": 0, "loads": set(), **{c: [] for c in PERF_COLUMNS}})
        row["points"] += 1
        row["loads"].update(f"{w} {ld}" for w, ld in zip(group["workload"], group["load"]))
        for column in PERF_COLUMNS:
            row[column] += [v for v in group[column] if pd.notna(v)]
    return {
        label: {
            "points": row["points"],
            "loads": ", ".join(sorted(row["loads"])),
            **{c: (sum(row[c]) / len(row[c]) if row[c] else None) for c in PERF_COLUMNS},
        }
        for label, row in out.items()
    }


def tradeoff_frame(perf: dict[str, dict], rows: Sequence, settings: Sequence[str]) -> pd.DataFrame:
    """One row per KV setting: the run's performance, and the eval's KL, top-1 agreement, perplexity change %
    and task headline changes %, each with its 95% interval where the eval has one."""
    by = {(row.setting, row.source, row.name): row for row in rows}
    out = []
    for label in list(dict.fromkeys([*settings, *perf])):
        entry: dict[str, object] = {"kv_setting": label}
        entry.update({c: perf.get(label, {}).get(c) for c in PERF_COLUMNS})
        kl = by.get((label, "direct", "kl"))
        entry["kl"] = None if kl is None else kl.value
        top1 = by.get((label, "direct", "top1_agreement"))
        entry["top1_agreement"] = None if top1 is None else top1.value
        for prefix, key in (
            ("perplexity", (label, "direct", "perplexity")),
            *((task, (label, "lm-eval", f"{task}/{spec.headline}")) for task, spec in TASKS.items()),
        ):
            row = by.get(key)
            if row is None:
                continue
            entry[f"{prefix}_delta_pct"] = row.delta_pct
            entry[f"{prefix}_ci_low"] = row.ci_low if row.ci_of == "delta_pct" else None
            entry[f"{prefix}_ci_high"] = row.ci_high if row.ci_of == "delta_pct" else None
        entry["run_points"] = perf.get(label, {}).get("points", 0)
        out.append(entry)
    return pd.DataFrame(out)
