"""llm-d benchmark reports (llm-d-benchmark's standard format, schema 0.2 / 0.2.1; YAML or JSON) read into rows of
kvbench's summary table, beside vLLM's, AIPerf's and guidellm's files (measure/foreign_results.py): one row per
report, labelled by the tool that made the measurement (`scenario.load.standardized.tool`, e.g. inference-perf,
or kvbench for our own llmd/<point>.yaml).

The report's aggregate latencies are in seconds: time_to_first_token is our TTFT, time_per_output_token our TPOT,
inter_token_latency our ITL and request_latency our E2E (times 1000). Its throughput means are our tokens/s and
requests/s. A statistic the report leaves out is missing in the row, never 0; the report has no prefix-cache hit
rate per request (a server's cache_hit_rate is a time series), so those columns are missing too.

Parsing is typed (msgspec Structs, unknown keys ignored): a value of the wrong type is refused in one line naming
its path. Pure: `report_points` takes the decoded mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from kvbench.distribution import PERCENTILES
from kvbench.settings import SettingsError

REPORT_VERSIONS = ("0.2", "0.2.1")
LLMD_SUFFIXES = (".yaml", ".yml")
# kvbench's metric -> the report's aggregate latency name (seconds).
LATENCY_NAMES = {
    "ttft": "time_to_first_token",
    "tpot": "time_per_output_token",
    "itl": "inter_token_latency",
    "e2e": "request_latency",
}
THROUGHPUT_NAMES = {"output_tok_s": "output_token_rate", "total_tok_s": "total_token_rate", "req_s": "request_rate"}


@dataclass(frozen=True)
class ForeignPoint:
    """One measured point of another tool's file, in kvbench's summary columns (`values`) and labels."""

    tool: str
    engine: str
    workload: str
    load: str
    requests: int
    errors: int
    run_id: str
    values: dict = field(default_factory=dict)


class Statistics(msgspec.Struct, forbid_unknown_fields=False):
    units: str
    mean: float
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class Requests(msgspec.Struct, forbid_unknown_fields=False):
    total: int
    failures: int | None = None


class Aggregate(msgspec.Struct, forbid_unknown_fields=False):
    requests: Requests | None = None
    latency: dict[str, Statistics | None] = {}
    throughput: dict[str, Statistics | None] = {}


class RequestPerformance(msgspec.Struct, forbid_unknown_fields=False):
    aggregate: Aggregate | None = None


class Results(msgspec.Struct, forbid_unknown_fields=False):
    request_performance: RequestPerformance | None = None


class SequenceLength(msgspec.Struct, forbid_unknown_fields=False):
    value: float


class LoadStandardized(msgspec.Struct, forbid_unknown_fields=False):
    tool: str = "unknown"
    tool_version: str = ""
    stage: int = 0
    input_seq_len: SequenceLength | None = None
    output_seq_len: SequenceLength | None = None
    rate_qps: float | None = None
    concurrency: float | None = None


class Load(msgspec.Struct, forbid_unknown_fields=False):
    standardized: LoadStandardized | None = None


class ComponentMetadata(msgspec.Struct, forbid_unknown_fields=False):
    label: str = ""


class Component(msgspec.Struct, forbid_unknown_fields=False):
    metadata: ComponentMetadata | None = None
    standardized: dict = {}


class Scenario(msgspec.Struct, forbid_unknown_fields=False):
    stack: list[Component] = []
    load: Load | None = None


class Run(msgspec.Struct, forbid_unknown_fields=False):
    uid: str


class Report(msgspec.Struct, forbid_unknown_fields=False):
    version: str
    run: Run
    results: Results
    scenario: Scenario | None = None


def is_report(data) -> bool:
    """A decoded file that says it is an llm-d benchmark report (its version, run and results)."""
    return (
        isinstance(data, dict) and str(data.get("version")) in REPORT_VERSIONS and "results" in data and "run" in data
    )


def report_points(data, name: str, where: str) -> list[ForeignPoint]:
    """The report's one point; SettingsError naming the field for a value of the wrong type."""
    try:
        report = msgspec.convert(data, Report)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"{where}: not an llm-d benchmark report kvbench reads: {exc}") from None
    aggregate = (report.results.request_performance or RequestPerformance()).aggregate or Aggregate()
    values: dict[str, float | None] = {}
    for ours, theirs in LATENCY_NAMES.items():
        stats = aggregate.latency.get(theirs)
        for p in PERCENTILES:
            value = getattr(stats, f"p{p}") if stats is not None else None
            values[f"{ours}_p{p}_ms"] = value * 1e3 if value is not None else None
    for ours, theirs in THROUGHPUT_NAMES.items():
        stats = aggregate.throughput.get(theirs)
        values[ours] = stats.mean if stats is not None else None
    requests = aggregate.requests or Requests(total=0)
    load = (report.scenario.load if report.scenario else None) or Load()
    standardized = load.standardized or LoadStandardized()
    stack = report.scenario.stack if report.scenario else []
    return [
        ForeignPoint(
            tool=f"llm-d report: {standardized.tool} {standardized.tool_version}".rstrip(),
            engine=_engine(stack),
            workload=_workload(standardized),
            load=_load(standardized),
            requests=requests.total,
            errors=requests.failures or 0,
            run_id=f"{name}#{standardized.stage}",
            values=values,
        )
    ]


def _engine(stack: list[Component]) -> str:
    if not stack:
        return "unknown"
    first = stack[0]
    model = first.standardized.get("model")
    label = first.metadata.label if first.metadata else ""
    model_name = model.get("name") if isinstance(model, dict) else model
    return str(label or model_name or first.standardized.get("tool") or "unknown")[:120]


def _workload(load: LoadStandardized) -> str:
    isl = f"isl={load.input_seq_len.value:g}" if load.input_seq_len else ""
    osl = f"osl={load.output_seq_len.value:g}" if load.output_seq_len else ""
    return ",".join(part for part in (isl, osl) if part) or "unknown"


def _load(load: LoadStandardized) -> str:
    rate = f"rps={load.rate_qps:g}" if load.rate_qps is not None else ""
    concurrency = (
        f"conc={load.concurrency:g}" if load.concurrency is not None and load.concurrency != float("inf") else ""
    )
    return ",".join(part for part in (rate, concurrency) if part) or f"stage={load.stage}"
