"""Files another tool can read: per-request metrics, and per point a `vllm bench serve` result JSON and an llm-d
benchmark report (`llmd/<point>.yaml`, measure/llmd_report.py).

- `requests_metrics.jsonl` (and `requests_metrics.parquet` when pyarrow is installed): one row per request,
  with what requests.jsonl only holds raw: TTFT, the ITL list, TPOT, E2E (ms), cached and reusable tokens,
  wall-clock (epoch) timestamps, and the engine and KV setting of its point. The latencies are
  `metrics.py`'s own per-request functions, so the rows' percentiles are the summary's.
- `vllm/<point>.json`: the point in vLLM's `--save-result` format (vllm/benchmarks/serve.py: `result_json`
  with its key names, times in seconds or ms as vLLM has them), its numbers taken from the point's summary;
  kvbench's own identity and cache rates under `kvbench`.

Where vLLM counts differently it is said here, not hidden: vLLM's ITL is one gap per streamed chunk, ours
splits a chunk of k tokens into k gaps; vLLM's TPOT of a one-token answer is 0 for goodput, ours is missing
and such a request does not meet a TPOT SLO.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from kvbench.distribution import PERCENTILES
from kvbench.measure.llmd_report import benchmark_report
from kvbench.measure.metrics import (
    NS_PER_S,
    e2e_ms,
    itl_ms,
    output_token_count,
    queue_wait_ms,
    recomputed_tokens,
    tpot_ms,
    ttft_from_schedule_ms,
    ttft_ms,
)
from kvbench.measure.records import RequestRecord
from kvbench.measure.run_folder import (
    LLMD_RESULTS_DIR,
    REQUESTS_METRICS_JSONL,
    REQUESTS_METRICS_PARQUET,
    VLLM_RESULTS_DIR,
    RunEntry,
    engine_dir,
    replace_file,
)

# vLLM's metric names -> kvbench's summary keys.
VLLM_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
VLLM_BACKENDS = {"completions": "openai", "chat": "openai-chat"}


def request_rows(entry: RunEntry, records: Sequence[RequestRecord]) -> list[dict]:
    """One row per request of the point `entry`; epoch times are None when the entry has no clock offset (a
    summary rebuilt after a kill)."""
    offset = entry.clock_offset_ns

    def epoch(ns: int | None) -> float | None:
        return (ns + offset) / NS_PER_S if ns is not None and offset is not None else None

    return [
        {
            "run_id": record.run_id,
            "request_id": record.request_id,
            "session_id": record.session_id,
            "tenant": record.tenant,
            "turn": record.turn,
            "engine": entry.engine,
            "engine_name": entry.engine_name,
            "kv_dtype": entry.kv_dtype,
            "engine_settings": dict(entry.engine_settings),
            "workload": entry.workload,
            "load": entry.load,
            "repeat": entry.repeat,
            "warmup": record.warmup,
            "ok": record.ok,
            "error": record.error,
            "planned_at": epoch(record.planned_ns),
            "sent_at": epoch(record.sent_ns),
            "first_token_at": epoch(record.first_token_ns),
            "done_at": epoch(record.done_ns),
            "ttft_ms": ttft_ms(record),
            "tpot_ms": tpot_ms(record),
            "e2e_ms": e2e_ms(record),
            "itl_ms": itl_ms(record),
            "ttft_from_schedule_ms": ttft_from_schedule_ms(record),
            "queue_wait_ms": queue_wait_ms(record),
            "prompt_tokens": record.prompt_tokens,
            "output_tokens": output_token_count(record),
            "cached_tokens": record.cached_tokens,
            "reusable_tokens": record.reusable_tokens,
            "recomputed_tokens": recomputed_tokens(record),
        }
        for record in records
    ]


def vllm_result(
    entry: RunEntry,
    records: Sequence[RequestRecord],
    load: Mapping,
    api: str = "completions",
    tokenizer: str | None = None,
) -> dict:
    """The point as `vllm bench serve --save-result` writes one run. `load` is the point's LoadSpec fields
    (request_rate, max_concurrency, burstiness, rate, concurrency)."""
    overall = entry.summary["overall"]
    model = entry.engine_description.get("model") or entry.engine_settings.get("model")
    rate = load.get("request_rate")
    if rate is None and load.get("concurrency") is not None:
        rate = float("inf")  # a closed loop: every request as soon as a slot frees, vLLM's inf with a cap
    result = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(entry.started_at)) if entry.started_at else None,
        "endpoint_type": VLLM_BACKENDS[api],
        "backend": VLLM_BACKENDS[api],
        "label": entry.engine,
        "model_id": model,
        "tokenizer_id": tokenizer or model,
        "num_prompts": overall["requests"],
        "request_rate": "inf" if rate is None or np.isinf(rate) else rate,
        "burstiness": load.get("burstiness", 1.0),
        "max_concurrency": load.get("max_concurrency") or load.get("concurrency"),
        "duration": overall["duration_s"],
        "completed": overall["completed"],
        "failed": overall["errors"],
        "total_input_tokens": overall["cache"]["prompt_tokens"],
        "total_output_tokens": overall["output_tokens"],
        "request_throughput": overall["req_s"],
        "request_goodput": overall["goodput_req_s"],
        "output_throughput": overall["output_tok_s"],
        "total_token_throughput": overall["total_tok_s"],
        **_per_request_lists(records),
        **_peaks(records),
        "rtfx": 0.0,  # vLLM's inverse real-time factor of speech benchmarks; 0.0 for text, as vLLM writes it
    }
    for name, key in VLLM_METRICS.items():
        stats = overall.get(key)
        result[f"mean_{name}_ms"] = stats["mean"] if stats else None
        result[f"median_{name}_ms"] = stats["p50"] if stats else None
        result[f"std_{name}_ms"] = stats["std"] if stats else None
        for p in PERCENTILES:
            result[f"p{p}_{name}_ms"] = stats[f"p{p}"] if stats else None
    cache = overall["cache"]
    result["kvbench"] = {
        "run_id": entry.run_id,
        "engine_name": entry.engine_name,
        "kv_dtype": entry.kv_dtype,
        "workload": entry.workload,
        "load": entry.load,
        "valid": entry.valid,
        "invalid_reasons": list(entry.invalid_reasons),
        "slo_attainment": overall.get("slo_attainment"),
        "cache_hit_rate": cache["cache_hit_rate"],
        "oracle_hit_rate": cache["oracle_hit_rate"],
        "prefill_recompute_rate": cache["prefill_recompute_rate"],
    }
    return result


def _measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [record for record in records if not record.warmup]


def _per_request_lists(records: Sequence[RequestRecord]) -> dict:
    """vLLM's per-request lists kept without --save-detailed: latencies (s) and client queue times (s)."""
    measured = _measured(records)
    return {
        "latencies": [
            (value / 1e3 if (value := e2e_ms(record)) is not None and record.ok else 0.0) for record in measured
        ],
        "queue_times": [(value / 1e3 if (value := queue_wait_ms(record)) is not None else 0.0) for record in measured],
    }


def _peaks(records: Sequence[RequestRecord]) -> dict:
    """vLLM's peak output tokens/s and peak concurrent requests: per one-second bucket from the first send,
    a token counted in the bucket it arrived in, a request in every bucket it was in flight."""
    done = [
        record
        for record in _measured(records)
        if record.ok and record.sent_ns is not None and record.done_ns is not None
    ]
    if not done:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start = min(record.sent_ns for record in done)
    buckets = int(np.ceil((max(record.done_ns for record in done) - start) / NS_PER_S)) + 1
    tokens, in_flight = np.zeros(buckets), np.zeros(buckets)
    for record in done:
        for arrival_ns, count in record.chunks:
            tokens[min(int((arrival_ns - start) // NS_PER_S), buckets - 1)] += count
        first, last = int((record.sent_ns - start) // NS_PER_S), int((record.done_ns - start) // NS_PER_S)
        in_flight[first : last + 1] += 1
    return {"max_output_tokens_per_s": float(tokens.max()), "max_concurrent_requests": int(in_flight.max())}


def write_exports(
    run_dir: Path,
    entries: Sequence[RunEntry],
    records_by_run: Mapping[str, Sequence[RequestRecord]],
    loads: Mapping[str, Mapping],
    api: str = "completions",
    tokenizer: str | None = None,
) -> list[Path]:
    """requests_metrics.jsonl (+ .parquet with pyarrow) over every point, and vllm/<point>.json per point;
    `loads` maps a point's load label to its LoadSpec fields. Returns the files written."""
    rows = [row for entry in entries for row in request_rows(entry, records_by_run.get(entry.run_id, ()))]
    written = [run_dir / REQUESTS_METRICS_JSONL]
    replace_file(written[0], "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))
    try:
        import pyarrow  # noqa: F401 - only to know parquet can be written
    except ImportError:
        pass
    else:
        import pandas as pd

        # Settings as JSON text: parquet has no type for an empty mapping, nor for mappings whose keys differ.
        frame = pd.DataFrame(
            [{**row, "engine_settings": json.dumps(row["engine_settings"], sort_keys=True)} for row in rows]
        )
        frame.to_parquet(run_dir / REQUESTS_METRICS_PARQUET, index=False)
        written.append(run_dir / REQUESTS_METRICS_PARQUET)
    import yaml

    (run_dir / VLLM_RESULTS_DIR).mkdir(exist_ok=True)
    (run_dir / LLMD_RESULTS_DIR).mkdir(exist_ok=True)
    version = _kvbench_version()
    for entry in entries:
        records, load = records_by_run.get(entry.run_id, ()), loads.get(entry.load, {})
        point = engine_dir(Path(), entry.run_id).name
        vllm_path, llmd_path = (
            run_dir / VLLM_RESULTS_DIR / f"{point}.json",
            run_dir / LLMD_RESULTS_DIR / f"{point}.yaml",
        )
        replace_file(vllm_path, json.dumps(vllm_result(entry, records, load, api, tokenizer), indent=1, default=str))
        replace_file(llmd_path, yaml.safe_dump(benchmark_report(entry, records, load, version), sort_keys=False))
        written += [vllm_path, llmd_path]
    return written


def _kvbench_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvbench")
    except PackageNotFoundError:
        return "unknown"
