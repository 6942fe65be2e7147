"""Result files of other benchmarks read into rows of kvbench's summary table, so `kvbench report` puts them
beside our run folders, labelled by the tool that wrote them:

- `vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py's `result_json`; our `vllm/<point>.json` too);
- AIPerf's `profile_export_aiperf.json` (or the artifact folder holding it);
- guidellm's `benchmarks.json` (`guidellm run --output kind=json`), one row per benchmark in it;
- an llm-d benchmark report (llmd_results.py) and inference-perf's lifecycle metrics (inference_perf_results.py).

This module is the one owner of the mapping from their key names to our summary columns (`VLLM_KEYS`,
`AIPERF_KEYS`, `GUIDELLM_KEYS`, side by side). What a tool does not measure (cache hit rates, the oracle) is
missing, not 0. Where a tool counts differently from kvbench it is said at its mapping. A file that is none of
these, or a field of the wrong type, is a `ForeignResultError` naming the file and what was expected.

Parsing is pure (`foreign_rows` takes the decoded JSON); only `read_foreign` reads a file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from kvbench.distribution import PERCENTILES
from kvbench.measure import inference_perf_results, llmd_results
from kvbench.settings import SettingsError, read_yaml

AIPERF_JSON = "profile_export_aiperf.json"
EXPECTED = (f"a kvbench run folder, a `vllm bench serve --save-result` JSON, AIPerf's {AIPERF_JSON} (or its "
            "artifact folder), guidellm's benchmarks.json, an llm-d benchmark report (.yaml or .json) or "
            "inference-perf's *_lifecycle_metrics.json")
_METRICS = ("ttft", "tpot", "itl", "e2e")

# Our summary column -> vLLM's key (times in ms, throughputs per second, as vLLM writes them). vLLM writes
# p<P>_<metric>_ms only for its --metric-percentiles; the others are missing.
VLLM_KEYS: dict[str, tuple[str, ...]] = {
    **{f"{ours}_p{p}_ms": (f"p{p}_{theirs}_ms",) for ours, theirs in zip(_METRICS, ("ttft", "tpot", "itl", "e2el"))
       for p in PERCENTILES},
    **{f"{ours}_p50_ms": (f"median_{theirs}_ms",) for ours, theirs in zip(_METRICS, ("ttft", "tpot", "itl", "e2el"))},
    "output_tok_s": ("output_throughput",), "total_tok_s": ("total_token_throughput",),
    "req_s": ("request_throughput",), "goodput_req_s": ("request_goodput",),
}
# AIPerf (0.13, schema 1.4): each metric an object with its unit and avg/p1..p99. AIPerf's inter_token_latency
# is a request's (latency - TTFT) / (tokens - 1), vLLM's and our TPOT; its inter_chunk_latency (the gaps
# between streamed chunks) is the nearest to our ITL, which splits a chunk of k tokens into k gaps.
AIPERF_KEYS: dict[str, tuple[str, ...]] = {
    **{f"{ours}_p{p}_ms": (theirs, f"p{p}") for ours, theirs in zip(
        _METRICS, ("time_to_first_token", "inter_token_latency", "inter_chunk_latency", "request_latency"))
       for p in PERCENTILES},
    "output_tok_s": ("output_token_throughput", "avg"), "total_tok_s": ("total_token_throughput", "avg"),
    "req_s": ("request_throughput", "avg"), "goodput_req_s": ("goodput", "avg"),
    "slo_attainment": ("good_request_fraction", "avg"),
}
# guidellm (0.8, benchmarks.json version 2): per benchmark, metrics.<name>.<status> distributions. Latencies of
# successful requests; throughputs over all requests, as guidellm's own console shows them. guidellm's
# inter_token_latency_ms excludes the first token (its goodput SLO compares vLLM's tpot with it) and is our TPOT
# and ITL; its time_per_output_token_ms counts the first token and has no kvbench column.
_GUIDELLM_LATENCY = {"ttft": "time_to_first_token_ms", "tpot": "inter_token_latency_ms",
                     "itl": "inter_token_latency_ms", "e2e": "request_latency"}
GUIDELLM_KEYS: dict[str, tuple[str, ...]] = {
    **{f"{ours}_p{p}_ms": ("metrics", theirs, "successful", "percentiles", f"p{p}")
       for ours, theirs in _GUIDELLM_LATENCY.items() for p in PERCENTILES},
    "output_tok_s": ("metrics", "output_tokens_per_second", "total", "mean"),
    "total_tok_s": ("metrics", "tokens_per_second", "total", "mean"),
    "req_s": ("metrics", "requests_per_second", "total", "mean"),
    "goodput_req_s": ("metrics", "request_goodput", "total", "mean"),
    "slo_attainment": ("metrics", "slo_attainment"),
}
_GUIDELLM_SECONDS = {"e2e"}  # guidellm's request_latency is in seconds
_VLLM_REQUIRED = ("completed", "failed", "request_throughput", "output_throughput")
_AIPERF_TO_MS = {"ms": 1.0, "sec": 1e3, "s": 1e3, "ns": 1e-6, "us": 1e-3}


class ForeignResultError(SettingsError):
    """A result file that is not what it claims (bad input: the CLI exits 2)."""


def is_foreign(path: Path) -> bool:
    """A file (kvbench run folders are folders), or an AIPerf artifact folder."""
    return path.is_file() or (path.is_dir() and (path / AIPERF_JSON).is_file())


def read_foreign(path: Path) -> list[dict]:
    """The summary rows (tenant `all`) of another tool's result file or AIPerf artifact folder."""
    file = path / AIPERF_JSON if path.is_dir() else path
    if file.suffix in llmd_results.LLMD_SUFFIXES or file.suffix == ".json" and _other_tool(file):
        return [_point_row(point) for point in _other_tool_points(file)]
    try:
        data = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ForeignResultError(f"{file}: not JSON ({exc}); expected {EXPECTED}") from None
    return foreign_rows(data, path.name if path.is_dir() else file.stem, str(file))


def foreign_rows(data, name: str, where: str) -> list[dict]:
    """Summary rows of a decoded result file; `name` labels its rows (run_id), `where` names it in errors."""
    if isinstance(data, dict) and "aiperf_version" in data:
        return [_aiperf_row(data, name, where)]
    if isinstance(data, dict) and isinstance(data.get("metadata"), dict) and "guidellm_version" in data["metadata"]:
        benchmarks = data.get("benchmarks")
        if not isinstance(benchmarks, list) or not benchmarks:
            raise ForeignResultError(f"{where}: a guidellm file without benchmarks; expected a non-empty list")
        version = data["metadata"]["guidellm_version"]
        workload = _guidellm_workload(_walk(data, ("config", "spec", "data"))) or name
        return [_guidellm_row(benchmark, f"{name}#{index}", f"{where}: benchmarks[{index}]", version, workload)
                for index, benchmark in enumerate(benchmarks)]
    if isinstance(data, dict) and any(key in data for key in _VLLM_REQUIRED):
        missing = [key for key in _VLLM_REQUIRED if key not in data]
        if missing:
            raise ForeignResultError(f"{where}: not a vllm bench serve result: no {', '.join(missing)}")
        return [_vllm_row(data, name, where)]
    raise ForeignResultError(f"{where}: not a result file kvbench reads; expected {EXPECTED}")


def _other_tool(file: Path) -> bool:
    """An inference-perf lifecycle file or an llm-d report in JSON (told apart by their top-level keys)."""
    try:
        data = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError):
        return False
    return llmd_results.is_report(data) or inference_perf_results.is_lifecycle(data)


def _other_tool_points(file: Path) -> list:
    """The points of an llm-d benchmark report (YAML or JSON) or of inference-perf's lifecycle metrics."""
    data = read_yaml(file, "result file")  # JSON is YAML
    if llmd_results.is_report(data):
        return llmd_results.report_points(data, file.stem, str(file))
    if inference_perf_results.is_lifecycle(data):
        config = file.parent / inference_perf_results.CONFIG_YAML
        settings = read_yaml(config, "inference-perf config") if config.is_file() else None
        return inference_perf_results.lifecycle_points(data, file.stem, str(file), settings if isinstance(settings, dict) else None)
    raise ForeignResultError(f"{file}: not a result file kvbench reads; expected {EXPECTED}")


def _point_row(point) -> dict:
    return _row(point.tool, point.values, engine=point.engine, workload=point.workload, load=point.load,
                requests=point.requests, errors=point.errors, run_id=point.run_id)


def _vllm_row(data: Mapping, name: str, where: str) -> dict:
    completed, failed = _count(data.get("completed"), "completed", where), _count(data.get("failed"), "failed", where)
    rate, cap = data.get("request_rate"), data.get("max_concurrency")
    load = f"rps={rate}" if rate not in (None, "inf") else "rps=inf"
    return _row(
        "vllm bench", {column: _number(data, keys, where) for column, keys in VLLM_KEYS.items()},
        engine=str(data.get("label") or data.get("backend") or "vllm bench"),
        workload=str(data.get("dataset_name") or data.get("model_id") or name),
        load=load + (f",max={cap}" if cap is not None else ""), requests=completed + failed, errors=failed,
        run_id=name,
    )


def _aiperf_row(data: Mapping, name: str, where: str) -> dict:
    values = {}
    for column, keys in AIPERF_KEYS.items():
        value = _number(data, keys, where)
        if value is not None and column.endswith("_ms"):
            unit = _walk(data, (keys[0], "unit"))
            if unit not in _AIPERF_TO_MS:
                raise ForeignResultError(f"{where}: {keys[0]}.unit is {unit!r:.40}; expected one of {', '.join(_AIPERF_TO_MS)}")
            value *= _AIPERF_TO_MS[unit]
        values[column] = value
    good = _count(_number(data, ("request_count", "avg"), where), "request_count.avg", where)
    errors = _number(data, ("error_request_count", "avg"), where)
    if errors is None:  # AIPerf writes error_request_count only when some request failed; error_summary always
        summary = data.get("error_summary") or []
        errors = sum(item.get("count", 0) for item in summary if isinstance(item, dict))
    errors = _count(errors, "error_request_count.avg", where)
    config = data.get("input_config") if isinstance(data.get("input_config"), dict) else {}
    models = _walk(config, ("models", "items")) or []
    phase = next((phase for phase in config.get("phases") or [] if isinstance(phase, dict)
                  and phase.get("kind", "profiling") == "profiling"), {})
    dataset = next(iter(config.get("datasets") or []), {})
    return _row(
        f"aiperf {data['aiperf_version']}", values,
        engine=str(models[0].get("name")) if models and isinstance(models[0], dict) else "aiperf",
        workload=_aiperf_workload(dataset) or name, load=_aiperf_load(phase), requests=good + errors, errors=errors,
        run_id=name,
    )


def _aiperf_load(phase: Mapping) -> str:
    rate, concurrency = phase.get("rate") or phase.get("request_rate"), phase.get("concurrency")
    if rate is not None:
        return f"rps={rate}" + (f",max={concurrency}" if concurrency is not None else "")
    if concurrency is not None:
        return f"conc={concurrency}"
    return str(phase.get("type") or "unknown")


def _aiperf_workload(dataset) -> str | None:
    if not isinstance(dataset, dict):
        return None
    isl, osl = _walk(dataset, ("prompts", "isl", "mean")), _walk(dataset, ("prompts", "osl", "mean"))
    shape = f" isl={isl:g},osl={osl:g}" if isinstance(isl, (int, float)) and isinstance(osl, (int, float)) else ""
    return f"{dataset.get('type') or dataset.get('name') or 'dataset'}{shape}"


def _guidellm_row(benchmark, name: str, where: str, version: str, workload: str) -> dict:
    if not isinstance(benchmark, dict) or not isinstance(benchmark.get("metrics"), dict):
        raise ForeignResultError(f"{where}: no metrics; expected a guidellm benchmark object")
    values = {column: _number(benchmark, keys, where) for column, keys in GUIDELLM_KEYS.items()}
    for metric in _GUIDELLM_SECONDS:
        for p in PERCENTILES:
            if (value := values.get(f"{metric}_p{p}_ms")) is not None:
                values[f"{metric}_p{p}_ms"] = value * 1e3
    totals = _walk(benchmark, ("metrics", "request_totals")) or {}
    successful = _count(totals.get("successful"), "metrics.request_totals.successful", where)
    errored = _count(totals.get("errored"), "metrics.request_totals.errored", where)
    config = benchmark.get("config") if isinstance(benchmark.get("config"), dict) else {}
    return _row(
        f"guidellm {version}", values, engine=str(_walk(config, ("backend", "model")) or "guidellm"),
        workload=workload, load=_guidellm_load(config.get("strategy")),
        requests=successful + errored, errors=errored, run_id=name,
    )


def _guidellm_load(strategy) -> str:
    """guidellm's strategy in our load labels: concurrent@N is conc=N, constant/poisson at R is rps=R."""
    if not isinstance(strategy, dict):
        return "unknown"
    kind = strategy.get("type_")
    if kind == "synchronous":
        return "conc=1"
    if kind == "concurrent":
        return f"conc={strategy.get('streams')}"
    if kind in ("constant", "poisson"):
        return f"rps={strategy.get('rate')}" + (",constant" if kind == "constant" else "")
    if kind == "throughput":
        return "rps=inf" + (f",max={strategy['max_concurrency']}" if strategy.get("max_concurrency") else "")
    return str(kind)


def _guidellm_workload(sources) -> str | None:
    """guidellm's first data source: its kind, and its token counts when synthetic."""
    source = sources[0] if isinstance(sources, list) and sources and isinstance(sources[0], dict) else None
    if source is None:
        return None
    prompt, output = source.get("prompt_tokens"), source.get("output_tokens")
    shape = f" isl={prompt},osl={output}" if prompt is not None and output is not None else ""
    return f"{source.get('kind') or 'data'}{shape}"


def _row(tool: str, values: Mapping[str, float | None], *, engine: str, workload: str, load: str, requests: int,
         errors: int, run_id: str) -> dict:
    """One summary row in kvbench's columns (summary_frame's), with `tool` naming who measured it."""
    return {
        **values, "tool": tool, "engine": engine, "kv_dtype": "unknown", "workload": workload, "load": load,
        "tenant": "all", "requests": requests, "errors": errors, "cache_hit_rate": None, "oracle_hit_rate": None,
        "prefill_recompute_rate": None, "run_id": run_id, "repeat": 0, "valid": errors == 0, "invalid_reasons": None,
    }


def _walk(data, keys: tuple[str, ...]):
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _number(data, keys: tuple[str, ...], where: str) -> float | None:
    value = _walk(data, keys)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ForeignResultError(f"{where}: {'.'.join(keys)} is {value!r:.40}; expected a number")
    return float(value)


def _count(value, key: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ForeignResultError(f"{where}: {key} is {value!r:.40}; expected a count")
    return value
