"""A simulated run as a run folder: the same entry dict, requests.jsonl and summaries as `harness/runner.py`.

`sim_entry` builds the entry `runner._run_point` builds for a real run (same keys), with the simulator's
settings and node statistics in `engine_description`; client lag is zero by construction, the cache was
empty at start (`cache_reset`), and there are no server counters to reconcile.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from kvbench.measure.metrics import SLO, summarize_run, ttft_ms
from kvbench.measure.records import RecordWriter
from kvbench.measure.report import REQUESTS_JSONL, write_plots, write_summaries
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, SimResult
from kvbench.workloads.spec import Workload

ENGINE_NAME = "sim"


def sim_label(config: SimConfig) -> str:
    return f"sim:{config.preset.name}"


def sim_settings(config: SimConfig) -> dict:
    return {
        "model": config.geometry.name,
        "hardware": config.hardware.name,
        "preset": config.preset.name,
        "kv_dtype": config.kv_dtype,
        "weight_dtype": config.cost.weights,
        "device_kv_tokens": config.device_kv_tokens,
    }


def sim_entry(result: SimResult, workload: Workload, load: LoadSpec, config: SimConfig, repeat: int = 0,
              slo: SLO = SLO()) -> dict:
    label = sim_label(config)
    summary = summarize_run(result.records, slo)
    completed = [r for r in result.records if r.ok]
    return {
        "run_id": f"{label}|{workload.name}|{load.label}|r{repeat}",
        "engine": label,
        "engine_name": ENGINE_NAME,
        "engine_settings": sim_settings(config),
        "kv_dtype": config.kv_dtype,
        "engine_description": {
            **sim_settings(config),
            "device_pages_per_node": result.device_pages,
            "page_size": config.preset.page_size,
            "nodes": list(result.nodes),
            "virtual_s": result.virtual_s,
            "wall_s": result.wall_s,
        },
        "workload": workload.name,
        "workload_params": dict(workload.params),
        "load": load.label,
        "repeat": repeat,
        "started_at": time.time(),
        "cache_reset": True,
        "summary": summary.to_dict(),
        "client": {"schedule_lag_ms": None, "loop_lag_ms": None, "max_lag_ms": 0.0, "valid": True,
                   "reason": "virtual clock: no client lag"},
        "valid": True,
        "aborted": None,
        "answer_sources": {"token_ids": len(completed)} if completed else {},
        "reconciliation": None,
        "server_counters": None,
    }


def write_sim_run(run_dir: Path, results: Sequence[tuple[SimResult, dict]], config_doc: dict,
                  plots: bool = True) -> None:
    """Write config.yaml, requests.jsonl, summary.{json,csv,md} (and plots) for simulated entries."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_doc, sort_keys=False))
    (run_dir / "env.json").write_text(json.dumps({"engine": ENGINE_NAME, "virtual_clock": True}, indent=2))
    with RecordWriter(run_dir / REQUESTS_JSONL) as writer:
        for result, _ in results:
            for record in result.records:
                writer.write(record)
    entries = [entry for _, entry in results]
    write_summaries(run_dir, entries)
    if plots and entries:
        ttfts = {entry["engine"]: [v for r in result.records if not r.warmup and (v := ttft_ms(r)) is not None]
                 for result, entry in results}
        write_plots(run_dir, entries, ttfts)
