"""Result files of other benchmarks read into rows of kvbench's summary table, so `kvbench report` puts them
beside our run folders, labelled by the tool that wrote them:

- `vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py's `result_json`; our `vllm/<point>.json` too);
- AIPerf's `profile_export_aiperf.json` (or the artifact folder holding it);
- guidellm's `benchmarks.json` (`guidellm run --output kind=json`), one row per benchmark in it;
- an llm-d benchmark report (llmd_results.py) and inference-perf's lifecycle metrics (inference_perf_results.py).

This module is the one owner of the mapping from their key names to our summary columns (`VLLM_KEYS`,
`AIPERF_KEYS`, `GUIDELLM_KEYS`, side by side). What a tool does not measure (cache hit rates, the oracle) is
missing, not 0. Where a tool counts differently from kvbench it is said at its mapping. A file that is none of
these, a field of the wrong type (any JSON value in any field), a file past `MAX_FOREIGN_BYTES` or nested
past msgspec's depth is a `ForeignResultError`: one line naming the file, the field and what was expected.

Each tool's file goes through its typed schema (`foreign_schemas`, derived from the key maps here) in one
linear pass: `READERS` maps how a file is recognised (`Sniff`, a first pass that builds nothing else) to its
schema and row maker; a new tool is one more entry. Labels are cut to `MAX_LABEL_CHARS` (a 5 MB `label` made
the report's table take minutes). Parsing is pure (`foreign_rows` takes decoded JSON); `read_foreign` reads.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kvbench.distribution import PERCENTILES
from kvbench.measure import foreign_schemas as schemas
from kvbench.measure import inference_perf_results, llmd_results
from kvbench.settings import SettingsError, read_yaml

AIPERF_JSON = "profile_export_aiperf.json"
EXPECTED = (
    f"a kvbench run folder, a `vllm bench serve --save-result` JSON, AIPerf's {AIPERF_JSON} (or its "
    "artifact folder), guidellm's benchmarks.json, an llm-d benchmark report (.yaml or .json) or "
    "inference-perf's *_lifecycle_metrics.json"
)
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
_VLLM_REQUIRED = ("completed", "failed", "request_throughput", "output_throughput")
_AIPERF_TO_MS = {"ms": 1.0, "sec": 1e3, "s": 1e3, "ns": 1e-6, "us": 1e-3}
MAX_FOREIGN_BYTES = 256 << 20  # a result file past this is refused before it is read
MAX_GUIDELLM_BENCHMARKS = 10_000  # rows of one file (a sweep has tens)
MAX_LABEL_CHARS = 120


class ForeignResultError(SettingsError):
    """A result file that is not what it claims (bad input: the CLI exits 2)."""


class Sniff(msgspec.Struct, forbid_unknown_fields=False):
    """What tells the tools apart, read without building the rest of the file."""

    aiperf_version: msgspec.Raw = msgspec.Raw()  # empty: absent
    metadata: msgspec.Raw = msgspec.Raw()
    completed: msgspec.Raw = msgspec.Raw()
    failed: msgspec.Raw = msgspec.Raw()
    request_throughput: msgspec.Raw = msgspec.Raw()
    output_throughput: msgspec.Raw = msgspec.Raw()


@dataclass(frozen=True)
class Reader:
    """One tool's file: whether a sniffed file is one (`claims`), its schema and its rows."""

    name: str
    claims: Callable[[Sniff], bool]
    schema: type
    rows: Callable[[object, str, str], list[dict]]


def is_foreign(path: Path) -> bool:
    """A file (kvbench run folders are folders), or an AIPerf artifact folder."""
    return path.is_file() or (path.is_dir() and (path / AIPERF_JSON).is_file())


def read_foreign(path: Path) -> list[dict]:
    """The summary rows (tenant `all`) of another tool's result file or AIPerf artifact folder."""
    file = path / AIPERF_JSON if path.is_dir() else path
    try:
        size = file.stat().st_size
        if size > MAX_FOREIGN_BYTES:
            raise ForeignResultError(
                f"{file}: {size:,} bytes, more than a result file holds ({MAX_FOREIGN_BYTES:,} "
                f"at most); expected {EXPECTED}"
            )
        if file.suffix in llmd_results.LLMD_SUFFIXES or file.suffix == ".json" and _other_tool(file):
            return [_point_row(point) for point in _other_tool_points(file)]
        raw = file.read_bytes()
    except OSError as exc:
        raise ForeignResultError(f"{file}: cannot read it ({exc.strerror}); expected {EXPECTED}") from None
    except RecursionError:
        raise ForeignResultError(f"{file}: nested deeper than any result file; expected {EXPECTED}") from None
    name, where = (path.name if path.is_dir() else file.stem), str(file)
    sniff = _decoded(lambda: msgspec.json.decode(raw, type=Sniff), where, "not JSON")
    reader = _reader(sniff, where)
    return reader.rows(_decoded(lambda: msgspec.json.decode(raw, type=reader.schema), where), name, where)


def foreign_rows(data, name: str, where: str) -> list[dict]:
    """Summary rows of decoded JSON; `name` labels its rows (run_id), `where` names it in errors."""
    reader = _reader(_raw_sniff(data), where)
    return reader.rows(_decoded(lambda: msgspec.convert(data, reader.schema), where), name, where)


def _raw_sniff(data) -> Sniff | None:
    """The `Sniff` of decoded JSON (None: not an object)."""
    if not isinstance(data, dict):
        return None
    present = {key: msgspec.Raw(b"1") for key in Sniff.__struct_fields__ if key in data}
    metadata = data.get("metadata")
    present["metadata"] = msgspec.Raw(
        b'{"guidellm_version"}' if isinstance(metadata, dict) and "guidellm_version" in metadata else b""
    )
    return Sniff(**present)


def _reader(sniff: Sniff | None, where: str) -> Reader:
    for reader in READERS if sniff is not None else ():
        if reader.claims(sniff):
            return reader
    raise ForeignResultError(f"{where}: not a result file kvbench reads; expected {EXPECTED}")


def _other_tool(file: Path) -> bool:
    """An inference-perf lifecycle file or an llm-d report in JSON (told apart by their top-level keys)."""
    try:
        data = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError):
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
        return inference_perf_results.lifecycle_points(
            data, file.stem, str(file), settings if isinstance(settings, dict) else None
        )
    raise ForeignResultError(f"{file}: not a result file kvbench reads; expected {EXPECTED}")


def _point_row(point) -> dict:
    return _row(
        point.tool,
        point.values,
        engine=point.engine,
        workload=point.workload,
        load=point.load,
        requests=point.requests,
        errors=point.errors,
        run_id=point.run_id,
    )


_PATH = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def _decoded(decode: Callable[[], object], where: str, what: str | None = None):
    """`decode()`, or ForeignResultError naming the field msgspec names (`$.a.b[0]` as a.b[0])."""
    try:
        return decode()
    except msgspec.ValidationError as exc:
        match = _PATH.match(str(exc))
        path = (match["path"] or "$").lstrip(".") or "the file"
        raise ForeignResultError(f"{where}: {path}: {match['what'][:120].lower()}") from None
    except msgspec.DecodeError as exc:
        raise ForeignResultError(f"{where}: {what or 'not JSON'} ({str(exc)[:100]}); expected {EXPECTED}") from None
    except RecursionError:
        raise ForeignResultError(f"{where}: nested deeper than any result file; expected {EXPECTED}") from None


def _vllm_row(data, name: str, where: str) -> list[dict]:
    missing = [key for key in _VLLM_REQUIRED if getattr(data, key) is None]
    if missing:
        raise ForeignResultError(f"{where}: not a vllm bench serve result: no {', '.join(missing)}")
    completed, failed = _count(data.completed, "completed", where), _count(data.failed, "failed", where)
    rate, cap = data.request_rate, data.max_concurrency
    load = f"rps={rate}" if rate not in (None, "inf") else "rps=inf"
    return [
        _row(
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


def _aiperf_row(data, name: str, where: str) -> list[dict]:
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
        _row(
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


def _guidellm_rows(data, name: str, where: str) -> list[dict]:
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
    return _row(
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


def _row(
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

READERS = (
    Reader("aiperf", lambda sniff: bool(sniff.aiperf_version), AIPERF, _aiperf_row),
    Reader("guidellm", lambda sniff: b'"guidellm_version"' in bytes(sniff.metadata), GUIDELLM, _guidellm_rows),
    Reader("vllm bench", lambda sniff: any(getattr(sniff, key) for key in _VLLM_REQUIRED), VLLM, _vllm_row),
)
