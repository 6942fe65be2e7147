"""inference-perf's lifecycle metrics (`summary_lifecycle_metrics.json`, `stage_<N>_lifecycle_metrics.json`; 0.7)
read into rows of kvbench's summary table, beside vLLM's, AIPerf's and guidellm's files (foreign_results.py).

Latencies of successful requests, in seconds there and ms here: time_to_first_token is our TTFT,
time_per_output_token our TPOT (inference-perf's: (latency - TTFT) / (tokens - 1), as vLLM's), inter_token_latency
our ITL (the gaps between streamed chunks; ours splits a chunk of k tokens into k gaps) and request_latency our
E2E; its `median` is our p50. Throughputs are successes.throughput's. The load is a stage's requested rate (the
summary over stages: the stages' rates in the config).
The model is in the `config.yaml` inference-perf writes beside its reports (server.model_name), read when there.

Parsing is typed (msgspec Structs, unknown keys ignored). Pure: `lifecycle_points` takes the decoded mapping.
"""

from __future__ import annotations

import msgspec

from kvbench.distribution import PERCENTILES
from kvbench.measure.llmd_results import ForeignPoint
from kvbench.settings import SettingsError

LATENCY_NAMES = {
    "ttft": "time_to_first_token",
    "tpot": "time_per_output_token",
    "itl": "inter_token_latency",
    "e2e": "request_latency",
}
THROUGHPUT_NAMES = {
    "output_tok_s": "output_tokens_per_sec",
    "total_tok_s": "total_tokens_per_sec",
    "req_s": "requests_per_sec",
}
CONFIG_YAML = "config.yaml"  # what inference-perf writes beside its reports


class Percentiles(msgspec.Struct, forbid_unknown_fields=False, rename={"p50": "median"}):
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class Successes(msgspec.Struct, forbid_unknown_fields=False):
    count: int
    latency: dict[str, Percentiles | None] = {}
    throughput: dict[str, float | None] = {}


class Failures(msgspec.Struct, forbid_unknown_fields=False):
    count: int = 0


class LoadSummary(msgspec.Struct, forbid_unknown_fields=False):
    count: int | None = None
    requested_rate: float | None = None


class Lifecycle(msgspec.Struct, forbid_unknown_fields=False):
    successes: Successes
    load_summary: LoadSummary | None = None
    failures: Failures | None = None


def is_lifecycle(data) -> bool:
    """A decoded file shaped like inference-perf's lifecycle metrics."""
    return isinstance(data, dict) and isinstance(data.get("successes"), dict) and "load_summary" in data


def lifecycle_points(data, name: str, where: str, config: dict | None = None) -> list[ForeignPoint]:
    """The file's one point (a stage's, or the summary over the stages); `config` is inference-perf's config.yaml
    beside it, if any. SettingsError naming the field for a value of the wrong type."""
    try:
        lifecycle = msgspec.convert(data, Lifecycle)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"{where}: not inference-perf lifecycle metrics kvbench reads: {exc}") from None
    values: dict[str, float | None] = {}
    for ours, theirs in LATENCY_NAMES.items():
        stats = lifecycle.successes.latency.get(theirs)
        for p in PERCENTILES:
            value = getattr(stats, f"p{p}") if stats is not None else None
            values[f"{ours}_p{p}_ms"] = value * 1e3 if value is not None else None
    for ours, theirs in THROUGHPUT_NAMES.items():
        values[ours] = lifecycle.successes.throughput.get(theirs)
    errors = lifecycle.failures.count if lifecycle.failures else 0
    rate = lifecycle.load_summary.requested_rate if lifecycle.load_summary else None
    server = (config or {}).get("server") if isinstance((config or {}).get("server"), dict) else {}
    data_config = (config or {}).get("data") if isinstance((config or {}).get("data"), dict) else {}
    return [
        ForeignPoint(
            tool="inference-perf",
            engine=str(server.get("model_name") or "inference-perf")[:120],
            workload=str(data_config.get("type") or name)[:120],
            load=_load(rate, (config or {}).get("load")),
            requests=lifecycle.successes.count + errors,
            errors=errors,
            run_id=name,
            values=values,
        )
    ]


def _load(rate: float | None, load_config) -> str:
    """A stage's requested rate; for the summary over stages, the stages' rates from the config (`unknown`
    without one)."""
    if rate is not None:
        return f"rps={rate:g}"
    stages = load_config.get("stages") if isinstance(load_config, dict) else None
    rates = [stage.get("rate") for stage in stages or () if isinstance(stage, dict)]
    if rates and all(isinstance(value, (int, float)) for value in rates):
        return ("rps=" if len(rates) == 1 else "stages rps=") + ",".join(f"{value:g}" for value in rates)
    return "unknown"
