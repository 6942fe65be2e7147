"""A simulated run as a run folder: the same `RunEntry`, requests.jsonl and summaries as a real run.

`sim_entry` builds its entry with `RunEntry.of`, as the harness runner does for a real run, with the
simulator's settings and node statistics in `engine_description`; client lag is zero by construction, the
cache was empty at start (`cache_reset`), and there are no server counters to reconcile.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

from kvbench.measure.metrics import SLO, ttft_values
from kvbench.measure.records import PointId, RecordWriter
from kvbench.measure.report import write_plots, write_summaries
from kvbench.measure.run_folder import REQUESTS_JSONL, RunEntry, write_config_and_env
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, SimResult
from kvbench.workloads.spec import Workload

ENGINE_NAME = "sim"


def sim_label(config: SimConfig) -> str:
    """`sim:<preset>/<kv dtype>`: one label per simulated setting, so two KV dtypes of a preset stay apart."""
    return f"sim:{config.preset.name}/{config.kv_dtype}"


def sim_point(config: SimConfig, workload: Workload, load: LoadSpec, repeat: int = 0) -> PointId:
    """The load point a simulation plays: its records and its entry carry this run_id."""
    return PointId(sim_label(config), workload.name, load.label, repeat)


def sim_settings(config: SimConfig) -> dict:
    return {
        "model": config.geometry.name,
        "hardware": config.hardware.name,
        "preset": config.preset.name,
        "kv_dtype": config.kv_dtype,
        "weight_dtype": config.cost.weights,
        "device_kv_tokens": config.device_kv_tokens,
    }


# What the client check of a real run reads here: a virtual clock cannot lag.
SIM_CLIENT = MappingProxyType(
    {
        "schedule_lag_ms": None,
        "loop_lag_ms": None,
        "max_lag_ms": 0.0,
        "valid": True,
        "reason": "virtual clock: no client lag",
    }
)


def sim_entry(
    result: SimResult, workload: Workload, load: LoadSpec, config: SimConfig, repeat: int = 0, slo: SLO = SLO()
) -> RunEntry:
    return RunEntry.of(
        sim_point(config, workload, load, repeat),
        result.records,
        slo,
        engine_name=ENGINE_NAME,
        engine_settings=sim_settings(config),
        kv_dtype=config.kv_dtype,
        engine_description={
            **sim_settings(config),
            "device_pages_per_node": result.device_pages,
            "page_size": config.preset.page_size,
            "nodes": list(result.nodes),
            "virtual_s": result.virtual_s,
            "wall_s": result.wall_s,
        },
        workload_params=dict(workload.params),
        started_at=time.time(),
        cache_reset=True,
        client=SIM_CLIENT,
    )


def write_sim_run(
    run_dir: Path, results: Sequence[tuple[SimResult, RunEntry]], config_doc: dict, plots: bool = True
) -> None:
    """Write config.yaml, requests.jsonl, summary.{json,csv,md} (and plots) for simulated entries."""
    write_config_and_env(run_dir, config_doc, {"engine": ENGINE_NAME, "virtual_clock": True})
    with RecordWriter(run_dir / REQUESTS_JSONL) as writer:
        writer.write_all(record for result, _ in results for record in result.records)
    entries = [entry for _, entry in results]
    write_summaries(run_dir, entries)
    if plots and entries:
        write_plots(run_dir, entries, {entry.engine: ttft_values(result.records) for result, entry in results})
