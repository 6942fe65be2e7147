"""`kvbench report` reads llm-d benchmark reports and inference-perf's lifecycle metrics beside vLLM's, AIPerf's and
guidellm's files: the fixtures were made by those tools here (tests/data/inference_perf/README.md), and kvbench's
own llm-d export reads back as its summary's numbers."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from kvbench.measure.export import write_exports
from kvbench.measure.foreign_results import read_foreign
from kvbench.measure.run_folder import LLMD_RESULTS_DIR
from kvbench.settings import SettingsError

from ..paths import REPO
from .test_export import LOAD, point  # noqa: F401 - the module's fixture: 8 requests on the instrument

DATA = REPO / "tests" / "data"
SUMMARY = DATA / "inference_perf" / "summary_lifecycle_metrics.json"
REPORT = DATA / "llmd" / "inference_perf_stage_0.yaml"


def test_inference_perfs_summary_is_a_row_in_ms_with_the_model_from_its_config():
    raw = json.loads(SUMMARY.read_text())["successes"]
    (row,) = read_foreign(SUMMARY)
    assert (row["tool"], row["engine"], row["load"], row["requests"], row["errors"]) == (
        "inference-perf",
        "instrument",
        "rps=20",
        20,
        0,
    )
    assert row["ttft_p99_ms"] == pytest.approx(raw["latency"]["time_to_first_token"]["p99"] * 1e3)
    assert row["ttft_p50_ms"] == pytest.approx(raw["latency"]["time_to_first_token"]["median"] * 1e3)
    assert row["tpot_p90_ms"] == pytest.approx(raw["latency"]["time_per_output_token"]["p90"] * 1e3)
    assert row["output_tok_s"] == pytest.approx(raw["throughput"]["output_tokens_per_sec"])
    assert row["cache_hit_rate"] is None  # not measured: missing, not 0


def test_an_llmd_report_made_by_the_package_from_inference_perf_reads_as_the_same_point():
    (from_report,) = read_foreign(REPORT)
    (from_stage,) = read_foreign(DATA / "inference_perf" / "stage_0_lifecycle_metrics.json")
    assert from_report["tool"].startswith("llm-d report: inference-perf")
    assert from_report["requests"] == from_stage["requests"] == 20 and from_report["load"] == "rps=20"
    for column in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p90_ms", "itl_p95_ms", "output_tok_s", "req_s"):
        assert from_report[column] == pytest.approx(from_stage[column]), column


def test_kvbenchs_own_llmd_export_reads_back_as_its_summary(point, tmp_path):  # noqa: F811
    entry, records, _, _ = point
    write_exports(tmp_path, [entry], {entry.run_id: records}, {LOAD.label: dataclasses.asdict(LOAD)})
    (path,) = (tmp_path / LLMD_RESULTS_DIR).iterdir()
    (row,) = read_foreign(path)
    overall = entry.summary["overall"]
    assert row["tool"].startswith("llm-d report: kvbench") and row["engine"] == entry.engine
    assert row["ttft_p99_ms"] == pytest.approx(overall["ttft_ms"]["p99"])
    assert row["e2e_p50_ms"] == pytest.approx(overall["e2e_ms"]["p50"])
    assert row["req_s"] == pytest.approx(overall["req_s"]) and row["requests"] == overall["requests"]


@pytest.mark.parametrize(
    "fixture, edit, named",
    [
        (REPORT, lambda d: d["results"]["request_performance"]["aggregate"]["requests"].update(total="many"), "total"),
        (SUMMARY, lambda d: d["successes"]["latency"]["time_to_first_token"].update(median="fast"), "median"),
    ],
)
def test_a_wrong_value_is_refused_in_one_line_naming_its_field(fixture, edit, named, tmp_path):
    data = yaml.safe_load(fixture.read_text())
    edit(data)
    bad = tmp_path / fixture.name
    bad.write_text(json.dumps(data, default=str) if fixture.suffix == ".json" else yaml.safe_dump(data))
    with pytest.raises(SettingsError, match=named) as error:
        read_foreign(bad)
    assert "\n" not in str(error.value)
