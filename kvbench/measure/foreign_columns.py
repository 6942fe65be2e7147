"""Other benchmarks' result files in kvbench's summary columns: the one owner of the mapping from their key names
to ours (`VLLM_KEYS`, `AIPERF_KEYS`, `GUIDELLM_KEYS`, side by side), the typed schema each tool's file is decoded
with (derived from those maps, `foreign_schemas`), and the row makers that turn a decoded file into summary rows.

What a tool does not measure (cache hit rates, the oracle) is missing, not 0. Where a tool counts differently
from kvbench it is said at its mapping. A field of the wrong kind is a `ForeignResultError` naming the file and
the field. Labels are cut to `MAX_LABEL_CHARS` (a 5 MB `label` made the report's table take minutes). Which tool
wrote a file, and reading it, is `foreign_results`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kvbench.distribution import PERCENTILES
from kvbench.measure import foreign_schemas as schemas
from kvbench.settings import SettingsError

_METRICS = ("ttft", "tpot", "itl", "e2e")

# Our summary column -> vLLM's key (times in ms, throughputs per second, as vLLM writes them). vLLM writes
# p<P>_<metric>_ms only for its --metric-percentiles; the others are missing.
VLLM_KEYS: dict[str, tuple[str, ...]] = {
    **{
        f"{ours}_p{p}_ms": (f"p{p}_{theirs}_ms",)
        for ours, theirs in zip(_METRICS, ("ttft", "tpot", "itl", "e2el"))
        for p in PERCENTILES
    },
    **{f"{ours}_p50_ms": (f"median_{theirs}_ms",) for ours, theirs in zip(_METRICS, ("ttft", "tpot", "itl", "e2el"))},
    "output_tok_s": ("output_throughput",),
    "total_tok_s": ("total_token_throughput",),
    "req_s": ("request_throughput",),
    "goodput_req_s": ("request_goodput",),
}
# AIPerf (0.13, schema 1.4): each metric an object with its unit and avg/p1..p99. AIPerf's inter_token_latency
# is a request's (latency - TTFT) / (tokens - 1), vLLM's and our TPOT; its inter_chunk_latency (the gaps
# between streamed chunks) is the nearest to our ITL, which splits a chunk of k tokens into k gaps.
AIPERF_KEYS: dict[str, tuple[str, ...]] = {
    **{
        f"{ours}_p{p}_ms": (theirs, f"p{p}")
        for ours, theirs in zip(
            _METRICS, ("time_to_first_token", "inter_token_latency", "inter_chunk_latency", "request_latency")
        )
        for p in PERCENTILES
    },
    "output_tok_s": ("output_token_throughput", "avg"),
    "total_tok_s": ("total_token_throughput", "avg"),
    "req_s": ("request_throughput", "avg"),
    "goodput_req_s": ("goodput", "avg"),
    "slo_attainment": ("good_request_fraction", "avg"),
}
# guidellm (0.8, benchmarks.json version 2): per benchmark, metrics.<name>.<status> distributions. Latencies of
# successful requests; throughputs over all requests, as guidellm's own console shows them. guidellm's
# inter_token_latency_ms excludes the first token (its goodput SLO compares vLLM's tpot with it) and is our TPOT
# and ITL; its time_per_output_token_ms counts the first token and has no kvbench column.
_GUIDELLM_LATENCY = {
    "ttft": "time_to_first_token_ms",
    "tpot": "inter_token_latency_ms",
    "itl": "inter_token_latency_ms",
    "e2e": "request_latency",
}
GUIDELLM_KEYS: dict[str, tuple[str, ...]] = {
    **{
        f"{ours}_p{p}_ms": ("metrics", theirs, "successful", "percentiles", f"p{p}")
        for ours, theirs in _GUIDELLM_LATENCY.items()
        for p in PERCENTILES
    },
    "output_tok_s": ("metrics", "output_tokens_per_second", "total", "mean"),
    "total_tok_s": ("metrics", "tokens_per_second", "total", "mean"),
    "req_s": ("metrics", "requests_per_second", "total", "mean"),
    "goodput_req_s": ("metrics", "request_goodput", "total", "mean"),
    "slo_attainment": ("metrics", "slo_attainment"),
}
_GUIDELLM_SECONDS = {"e2e"}  # guidellm's request_latency is in seconds
VLLM_REQUIRED = ("completed", "failed", "request_throughput", "output_throughput")
_AIPERF_TO_MS = {"ms": 1.0, "sec": 1e3, "s": 1e3, "ns": 1e-6, "us": 1e-3}
MAX_GUIDELLM_BENCHMARKS = 10_000  # rows of one file (a sweep has tens)
MAX_LABEL_CHARS = 120


class ForeignResultError(SettingsError):
    """A result file that is not what it claims (bad input: the CLI exits 2)."""


def vllm_rows(data, name: str, where: str) -> list[dict]:
    missing = [key for key in VLLM_REQUIRED if getattr(data, key) is None]
    if missing:
        raise ForeignResultError(f"{where}: not a vllm bench serve result: no {', '.join(missing)}")
    completed, failed = _count(data.completed, "completed", where), _count(data.failed, "failed", where)
    rate, cap = data.request_rate, data.max_concurrency
    load = f"rps={rate}" if rate not in (None, "inf") else "rps=inf"
    return [
        summary_row(
            "vllm bench",
            {column: _finite(getattr(data, keys[0]), keys[0], where) for column, keys in VLLM_KEYS.items()},
            engine=_label(data.label or data.backend or "vllm bench"),
            workload=_label(data.dataset_name or data.model_id or name),
            load=_label(load + (f",max={cap}" if cap is not None else "")),
            requests=completed + failed,
            errors=failed,
            run_id=name,
        )
    ]


def aiperf_rows(data, name: str, where: str) -> list[dict]:
    values = {}
    for column, (metric_name, stat) in AIPERF_KEYS.items():
        metric = getattr(data, metric_name)
        value = _finite(getattr(metric, stat) if metric is not None else None, f"{metric_name}.{stat}", where)
        if value is not None and column.endswith("_ms"):
            if metric.unit not in _AIPERF_TO_MS:
                raise ForeignResultError(
                    f"{where}: {metric_name}.unit is {metric.unit!r:.40}; expected one of {', '.join(_AIPERF_TO_MS)}"
                )
            value *= _AIPERF_TO_MS[metric.unit]
        values[column] = value
    good = _count(data.request_count.avg if data.request_count else None, "request_count.avg", where)
    errors = data.error_request_count.avg if data.error_request_count else None
    if errors is None:  # AIPerf writes error_request_count only when some request failed; error_summary always
        errors = sum(item.count for item in data.error_summary or ())
    errors = _count(errors, "error_request_count.avg", where)
    config = data.input_config or schemas.AiperfConfig()
    models = (config.models.items if config.models else None) or []
    phase = next((phase for phase in config.phases or () if phase.kind == "profiling"), schemas.AiperfPhase())
    dataset = next(iter(config.datasets or ()), None)
    return [
        summary_row(
            f"aiperf {_label(data.aiperf_version)}",
            values,
            engine=_label(models[0].name or "aiperf") if models else "aiperf",
            workload=_label(_aiperf_workload(dataset) or name),
            load=_label(_aiperf_load(phase)),
            requests=good + errors,
            errors=errors,
            run_id=name,
        )
    ]


def _aiperf_load(phase) -> str:
    rate, concurrency = phase.rate or phase.request_rate, phase.concurrency
    if rate is not None:
        return f"rps={rate}" + (f",max={concurrency}" if concurrency is not None else "")
    if concurrency is not None:
        return f"conc={concurrency}"
    return str(phase.type or "unknown")


def _aiperf_workload(dataset) -> str | None:
    if dataset is None:
        return None
    prompts = dataset.prompts
    isl = prompts.isl.mean if prompts and prompts.isl else None
    osl = prompts.osl.mean if prompts and prompts.osl else None
    shape = f" isl={isl:g},osl={osl:g}" if isl is not None and osl is not None else ""
    return f"{dataset.type or dataset.name or 'dataset'}{shape}"


def guidellm_rows(data, name: str, where: str) -> list[dict]:
    version = _label(data.metadata.guidellm_version)
    sources = data.config.spec.data if data.config and data.config.spec else None
    workload = _label(_guidellm_workload(sources) or name)
    return [
        _guidellm_row(benchmark, f"{name}#{index}", f"{where}: benchmarks[{index}]", version, workload)
        for index, benchmark in enumerate(data.benchmarks)
    ]


def _guidellm_row(benchmark, name: str, where: str, version: str, workload: str) -> dict:
    metrics = benchmark.metrics
    if metrics is None:
        raise ForeignResultError(f"{where}: no metrics; expected a guidellm benchmark object")
    values = {}
    for column, keys in GUIDELLM_KEYS.items():
        node = metrics
        for key in keys[1:]:
            node = getattr(node, key) if node is not None else None
        values[column] = _finite(node, ".".join(keys), where)
    for metric in _GUIDELLM_SECONDS:
        for p in PERCENTILES:
            if (value := values.get(f"{metric}_p{p}_ms")) is not None:
                values[f"{metric}_p{p}_ms"] = value * 1e3
    totals = metrics.request_totals or schemas.GuidellmTotals()
    successful = _count(totals.successful, "metrics.request_totals.successful", where)
    errored = _count(totals.errored, "metrics.request_totals.errored", where)
    config = benchmark.config or schemas.GuidellmBenchmarkConfig()
    return summary_row(
        f"guidellm {version}",
        values,
        engine=_label((config.backend.model if config.backend else None) or "guidellm"),
        workload=workload,
        load=_label(_guidellm_load(config.strategy)),
        requests=successful + errored,
        errors=errored,
        run_id=name,
    )


def _guidellm_load(strategy) -> str:
    """guidellm's strategy in our load labels: concurrent@N is conc=N, constant/poisson at R is rps=R."""
    if strategy is None:
        return "unknown"
    kind = strategy.type_
    if kind == "synchronous":
        return "conc=1"
    if kind == "concurrent":
        return f"conc={strategy.streams}"
    if kind in ("constant", "poisson"):
        return f"rps={strategy.rate}" + (",constant" if kind == "constant" else "")
    if kind == "throughput":
        return "rps=inf" + (f",max={strategy.max_concurrency}" if strategy.max_concurrency else "")
    return str(kind)


def _guidellm_workload(sources) -> str | None:
    """guidellm's first data source: its kind, and its token counts when synthetic."""
    if not sources:
        return None
    source = sources[0]
    prompt, output = source.prompt_tokens, source.output_tokens
    shape = f" isl={prompt},osl={output}" if prompt is not None and output is not None else ""
    return f"{source.kind or 'data'}{shape}"


def summary_row(
    tool: str,
    values: Mapping[str, float | None],
    *,
    engine: str,
    workload: str,
    load: str,
    requests: int,
    errors: int,
    run_id: str,
) -> dict:
    """One summary row in kvbench's columns (summary_frame's), with `tool` naming who measured it."""
    return {
        **values,
        "tool": tool,
        "engine": engine,
        "kv_dtype": "unknown",
        "workload": workload,
        "load": load,
        "tenant": "all",
        "requests": requests,
        "errors": errors,
        "cache_hit_rate": None,
        "oracle_hit_rate": None,
        "prefill_recompute_rate": None,
        "run_id": run_id,
        "repeat": 0,
        "valid": errors == 0,
        "invalid_reasons": None,
    }


def _grouped(pairs) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for name, member in pairs:
        groups.setdefault(name, set()).add(member)
    return groups


def _label(text: str) -> str:
    """A label from a file, cut to MAX_LABEL_CHARS (a table cell, not a payload)."""
    text = str(text)
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 3] + "..."


def _finite(value, key: str, where: str) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value):
        raise ForeignResultError(f"{where}: {key} is {value!r}; expected a finite number")
    return float(value)


def _count(value, key: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ForeignResultError(f"{where}: {key} is {value!r:.40}; expected a count")
    return value


VLLM = schemas.vllm_schema(keys[0] for keys in VLLM_KEYS.values())
AIPERF = schemas.aiperf_schema(
    {name: set() for name in ("request_count", "error_request_count")}
    | _grouped((keys[0], keys[1]) for keys in AIPERF_KEYS.values())
)
GUIDELLM = schemas.guidellm_schema(
    {
        name: set(statuses)
        for name, statuses in _grouped((keys[1], keys[2]) for keys in GUIDELLM_KEYS.values() if len(keys) > 2).items()
    },
    [f"p{p}" for p in PERCENTILES],
    MAX_GUIDELLM_BENCHMARKS,
)
