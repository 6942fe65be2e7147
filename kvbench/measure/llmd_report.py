"""A point as an llm-d benchmark report (llm-d-benchmark's standard format, schema version 0.2.1, whose schemas and
validators the `llmd-benchmark-report` package publishes): `llmd/<point>.yaml` in every run folder.

    version: 0.2.1
    run:       uid (the point's run id), time (start, end, ISO 8601 duration), description
    scenario:  stack (the engine as an inference_engine component: its adapter, model, KV setting), load (kvbench
               as the tool, the workload's prompt/output lengths, the point's rate or concurrency, the stage)
    results:   request_performance.aggregate: requests (total, failures, input/output lengths), latency (TTFT,
               TPOT, ITL, request latency in seconds), throughput (input/output/total tokens/s, requests/s).
               The prefix-cache hit rate kvbench measures per request has no field in request_performance (the
               report's cache_hit_rate is a server metric's time series), so it stays in kvbench's own files.

Statistics are the summary's own (mean, stddev, min, max, p50/p90/p95/p99, in seconds where the report has
seconds); a metric the point did not measure is left out, never written as 0. Lengths come from the point's
measured records. Pure: `benchmark_report` takes the entry and its records and returns the mapping.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

from kvbench.distribution import Distribution
from kvbench.measure.metrics import output_token_count
from kvbench.measure.records import RequestRecord
from kvbench.measure.run_folder import RunEntry

REPORT_VERSION = "0.2.1"
COMPONENT_SCHEMA = "0.0.1"
# kvbench's latency summaries (ms) -> the report's latency names (seconds).
LATENCIES = {
    "ttft_ms": "time_to_first_token",
    "tpot_ms": "time_per_output_token",
    "itl_ms": "inter_token_latency",
    "e2e_ms": "request_latency",
}
_LATENCY_UNITS = {
    "time_to_first_token": "s",
    "time_per_output_token": "s/token",
    "inter_token_latency": "s/token",
    "request_latency": "s",
}


def benchmark_report(entry: RunEntry, records: Sequence[RequestRecord], load: Mapping, version: str) -> dict:
    """The point `entry` (its measured `records`, its LoadSpec fields `load`) as an llm-d benchmark report;
    `version` is kvbench's, the load generator's tool_version."""
    overall = entry.summary["overall"]
    measured = [record for record in records if not record.warmup]
    duration = overall.get("duration_s")
    report = {
        "version": REPORT_VERSION,
        "run": {
            "uid": entry.run_id,
            "description": f"kvbench run point {entry.run_id}",
            "keywords": ["kvbench"],
            **({"time": _time(entry.started_at, duration)} if entry.started_at and duration else {}),
        },
        "scenario": {"stack": [_engine(entry)], "load": _load(entry, measured, load, version)},
        "results": {
            "request_performance": {
                "aggregate": {
                    "requests": _requests(overall, measured),
                    "latency": {
                        name: _seconds(overall.get(key), _LATENCY_UNITS[name])
                        for key, name in LATENCIES.items()
                        if overall.get(key)
                    },
                    "throughput": _throughput(overall),
                }
            }
        },
    }
    return report


def _time(started_at: float, duration_s: float) -> dict:
    start = datetime.datetime.fromtimestamp(started_at, datetime.timezone.utc)
    end = start + datetime.timedelta(seconds=duration_s)
    return {"start": start.isoformat(), "end": end.isoformat(), "duration": f"PT{duration_s:.6f}S"}


def _engine(entry: RunEntry) -> dict:
    model = entry.engine_description.get("model") or entry.engine_settings.get("model") or "unknown"
    return {
        "metadata": {"schema_version": COMPONENT_SCHEMA, "label": entry.engine, "cfg_id": entry.run_id.split("|")[0]},
        "standardized": {
            "kind": "generic",
            "tool": entry.engine_name or "unknown",
            "tool_version": str(entry.engine_description.get("version") or "unknown"),
            "model": str(model),
            "kv_dtype": entry.kv_dtype or "unknown",
        },
        "native": {
            "config": {key: _plain(value) for key, value in entry.engine_settings.items() if key not in ("api_key",)}
        },
    }


def _load(entry: RunEntry, records: Sequence[RequestRecord], load: Mapping, version: str) -> dict:
    rate = load.get("request_rate")
    concurrency = load.get("max_concurrency") or load.get("concurrency")
    standardized = {
        "tool": "kvbench",
        "tool_version": version,
        "source": "random" if entry.workload == "random" else "sampled",
        "input_seq_len": _length([record.prompt_tokens for record in records]),
    }
    outputs = [output_token_count(record) for record in records]
    if outputs:
        standardized["output_seq_len"] = _length(outputs)
    if isinstance(rate, (int, float)) and 0 < rate < float("inf"):
        standardized["rate_qps"] = float(rate)
    if concurrency:
        standardized["concurrency"] = concurrency
    stage = load.get("stage")
    if isinstance(stage, Mapping) and isinstance(stage.get("index"), int):
        standardized["stage"] = stage["index"]
    return {
        "metadata": {
            "schema_version": COMPONENT_SCHEMA,
            "cfg_id": entry.workload,
            "description": f"kvbench workload {entry.workload} at {entry.load}",
        },
        "standardized": standardized,
        "native": {"config": _plain(dict(load))},
    }


def _length(values: Sequence[int]) -> dict:
    """A sequence length as the report has it: its distribution's mean (fixed when every value is the same)."""
    if not values:
        return {"distribution": "fixed", "value": 0}
    low, high = min(values), max(values)
    if low == high:
        return {"distribution": "fixed", "value": low}
    return {"distribution": "other", "value": sum(values) / len(values), "min": low, "max": high}


def _requests(overall: Mapping, records: Sequence[RequestRecord]) -> dict:
    requests = {"total": overall["requests"], "failures": overall["errors"]}
    inputs = Distribution.of([record.prompt_tokens for record in records])
    outputs = Distribution.of([output_token_count(record) for record in records])
    if inputs is not None:
        requests["input_length"] = _statistics(inputs.to_dict(), "count", 1.0)
    if outputs is not None:
        requests["output_length"] = _statistics(outputs.to_dict(), "count", 1.0)
    return requests


def _throughput(overall: Mapping) -> dict:
    rates = {
        "output_token_rate": ("output_tok_s", "tokens/s"),
        "total_token_rate": ("total_tok_s", "tokens/s"),
        "request_rate": ("req_s", "queries/s"),
    }
    throughput = {
        name: {"units": units, "mean": overall[key]}
        for name, (key, units) in rates.items()
        if overall.get(key) is not None
    }
    if overall.get("total_tok_s") is not None and overall.get("output_tok_s") is not None:
        throughput["input_token_rate"] = {"units": "tokens/s", "mean": overall["total_tok_s"] - overall["output_tok_s"]}
    return throughput


def _seconds(stats: Mapping, units: str) -> dict:
    return _statistics(stats, units, 1e-3)


def _statistics(stats: Mapping, units: str, scale: float) -> dict:
    """A kvbench distribution as the report's Statistics, each value times `scale`."""
    out = {"units": units, "mean": stats["mean"] * scale}
    names = {"std": "stddev", "min": "min", "max": "max", "p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99"}
    for ours, theirs in names.items():
        if stats.get(ours) is not None:
            out[theirs] = stats[ours] * scale
    return out


def _plain(value):
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
