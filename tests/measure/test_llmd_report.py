"""The llm-d benchmark report written per point (llmd/<point>.yaml): validated by the `llmd-benchmark-report`
package's own schema (its pydantic models, what `benchmark-report` and llm-d-benchmark load), with the summary's
numbers in the report's units."""

from __future__ import annotations

import dataclasses

import llmd_benchmark_report as llmd  # the test extra's: the package's own schema and validators
import pytest
import yaml

from kvbench.measure.export import write_exports
from kvbench.measure.llmd_report import benchmark_report
from kvbench.measure.run_folder import LLMD_RESULTS_DIR

from .test_export import LOAD, point  # noqa: F401 - the module's fixture: 8 requests on the instrument


def test_every_point_is_written_as_a_report_the_packages_validator_accepts(point, tmp_path):  # noqa: F811
    entry, records, _, _ = point
    written = write_exports(tmp_path, [entry], {entry.run_id: records}, {LOAD.label: dataclasses.asdict(LOAD)})
    (path,) = (tmp_path / LLMD_RESULTS_DIR).iterdir()
    assert path in written
    report = llmd.load_benchmark_report(yaml.safe_load(path.read_text()))
    assert report.version == "0.2.1" and report.run.uid == entry.run_id
    overall = entry.summary["overall"]
    aggregate = report.results.request_performance.aggregate
    assert aggregate.requests.total == overall["requests"] == 8 and aggregate.requests.failures == 0
    ttft = aggregate.latency.time_to_first_token
    assert ttft.units.value == "s" and ttft.p99 == pytest.approx(overall["ttft_ms"]["p99"] / 1e3)
    assert aggregate.latency.time_per_output_token.mean == pytest.approx(overall["tpot_ms"]["mean"] / 1e3)
    assert aggregate.throughput.output_token_rate.mean == pytest.approx(overall["output_tok_s"])
    load = report.scenario.load.standardized
    assert (load.tool, load.rate_qps, load.concurrency) == ("kvbench", 50.0, 2)
    assert aggregate.requests.input_length.max == max(record.prompt_tokens for record in records)


def test_a_metric_not_measured_is_left_out_and_the_report_still_validates(point):  # noqa: F811
    entry, records, _, _ = point
    summary = {**entry.summary, "overall": {**entry.summary["overall"], "tpot_ms": None, "total_tok_s": None}}
    report = benchmark_report(dataclasses.replace(entry, summary=summary), records, {}, "test")
    latency = report["results"]["request_performance"]["aggregate"]["latency"]
    assert "time_per_output_token" not in latency and "time_to_first_token" in latency
    llmd.load_benchmark_report(report)


def test_the_validator_refuses_a_broken_report(point):  # noqa: F811 - the check can fail
    entry, records, _, _ = point
    report = benchmark_report(entry, records, {}, "test")
    report["results"]["request_performance"]["aggregate"]["requests"]["total"] = -1
    with pytest.raises(ValueError):
        llmd.load_benchmark_report(report)
