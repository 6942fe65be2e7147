"""The typed schema of each foreign result file kvbench reads (vLLM, AIPerf, guidellm), as msgspec Structs.

A file is decoded once (msgspec's JSON reader: linear, no Python recursion) and converted into its tool's
schema: any JSON value in any field is either the type the schema says or a `msgspec.ValidationError` naming
its path (`$.time_to_first_token.unit`). Fields kvbench does not read are skipped; a missing field is None
(missing, never 0). The metric fields are derived from `foreign_columns`' key maps (their one owner), so a
column added there is typed here without a second list.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import msgspec

Count = int | float  # a count may be written 6.0; `foreign_columns` checks it is whole and >= 0
Number = float | None
Label = str | None
_OPTIONAL = {"forbid_unknown_fields": False}


def _struct(name: str, fields: Iterable[tuple[str, object]]) -> type[msgspec.Struct]:
    """A Struct whose every field is optional (None when absent); a field named twice keeps its first type."""
    return msgspec.defstruct(name, [(field, kind | None, None) for field, kind in _unique(fields)], **_OPTIONAL)


def _unique(fields: Iterable[tuple[str, object]]) -> list[tuple[str, object]]:
    seen: dict[str, object] = {}
    for field, kind in fields:
        seen.setdefault(field, kind)
    return list(seen.items())


def vllm_schema(keys: Iterable[str]) -> type[msgspec.Struct]:
    """`vllm bench serve --save-result`: the metric `keys` (numbers) beside what labels and counts a row."""
    return _struct(
        "VllmResult",
        [
            ("completed", Count),
            ("failed", Count),
            ("label", str),
            ("backend", str),
            ("dataset_name", str),
            ("model_id", str),
            ("request_rate", float | str),
            ("max_concurrency", int),
            *((key, float) for key in keys),
        ],
    )


class AiperfModel(msgspec.Struct, **_OPTIONAL):
    name: Label = None


class AiperfModels(msgspec.Struct, **_OPTIONAL):
    items: list[AiperfModel] | None = None


class AiperfPhase(msgspec.Struct, **_OPTIONAL):
    kind: str = "profiling"
    rate: Number = None
    request_rate: Number = None
    concurrency: int | None = None
    type: Label = None


class AiperfMean(msgspec.Struct, **_OPTIONAL):
    mean: Number = None


class AiperfPrompts(msgspec.Struct, **_OPTIONAL):
    isl: AiperfMean | None = None
    osl: AiperfMean | None = None


class AiperfDataset(msgspec.Struct, **_OPTIONAL):
    type: Label = None
    name: Label = None
    prompts: AiperfPrompts | None = None


class AiperfConfig(msgspec.Struct, **_OPTIONAL):
    models: AiperfModels | None = None
    phases: list[AiperfPhase] | None = None
    datasets: list[AiperfDataset] | None = None


class AiperfError(msgspec.Struct, **_OPTIONAL):
    count: Annotated[int, msgspec.Meta(ge=0)] = 0


def aiperf_schema(metrics: dict[str, set[str]]) -> type[msgspec.Struct]:
    """AIPerf's profile_export_aiperf.json: each of `metrics` (name -> the statistics read) an object with its
    unit and those statistics."""
    stats = sorted({stat for wanted in metrics.values() for stat in wanted})
    metric = _struct("AiperfMetric", [("unit", str), *((stat, float) for stat in stats)])
    return _struct(
        "AiperfResult",
        [
            ("aiperf_version", str),
            ("error_summary", list[AiperfError]),
            ("input_config", AiperfConfig),
            *((name, metric) for name in metrics),
        ],
    )


class GuidellmModel(msgspec.Struct, **_OPTIONAL):
    model: Label = None


class GuidellmStrategy(msgspec.Struct, **_OPTIONAL):
    type_: Label = None
    streams: int | None = None
    rate: Number = None
    max_concurrency: int | None = None


class GuidellmBenchmarkConfig(msgspec.Struct, **_OPTIONAL):
    backend: GuidellmModel | None = None
    strategy: GuidellmStrategy | None = None


class GuidellmTotals(msgspec.Struct, **_OPTIONAL):
    successful: Count | None = None
    errored: Count | None = None


class GuidellmSource(msgspec.Struct, **_OPTIONAL):
    kind: Label = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None


class GuidellmSpec(msgspec.Struct, **_OPTIONAL):
    data: list[GuidellmSource] | None = None


class GuidellmConfig(msgspec.Struct, **_OPTIONAL):
    spec: GuidellmSpec | None = None


class GuidellmMetadata(msgspec.Struct, **_OPTIONAL):
    guidellm_version: str


def guidellm_schema(
    metrics: dict[str, dict[str, set[str]]], percentiles: Iterable[str], max_benchmarks: int
) -> type[msgspec.Struct]:
    """guidellm's benchmarks.json: per benchmark `metrics.<name>.<status>` distributions (mean, percentiles),
    request totals and the SLO attainment; at most `max_benchmarks` benchmarks."""
    distribution = _struct(
        "GuidellmDistribution",
        [("mean", float), ("percentiles", _struct("GuidellmPercentiles", [(p, float) for p in percentiles]))],
    )
    per_metric = {
        name: _struct(f"Guidellm_{name}", [(status, distribution) for status in statuses])
        for name, statuses in metrics.items()
    }
    metric_fields = _struct(
        "GuidellmMetrics", [("request_totals", GuidellmTotals), ("slo_attainment", float), *per_metric.items()]
    )
    benchmark = msgspec.defstruct(
        "GuidellmBenchmark", [("metrics", metric_fields), ("config", GuidellmBenchmarkConfig | None, None)], **_OPTIONAL
    )
    return msgspec.defstruct(
        "GuidellmResult",
        [
            ("metadata", GuidellmMetadata),
            ("benchmarks", Annotated[list[benchmark], msgspec.Meta(min_length=1, max_length=max_benchmarks)]),
            ("config", GuidellmConfig | None, None),
        ],
        **_OPTIONAL,
    )
