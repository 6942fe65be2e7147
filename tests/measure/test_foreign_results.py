"""Other tools' result files (written by the tools themselves: tests/data/*/README.md) as rows of kvbench's
summary table: each tool's key names land in our columns, in our units; a file that is none of them is one line."""

from __future__ import annotations

import io
import json
import shutil

import pandas as pd
import pytest
from rich.console import Console

from kvbench.measure.foreign_results import AIPERF_JSON, ForeignResultError, foreign_rows, read_foreign

from ..paths import REPO

DATA = REPO / "tests" / "data"
VLLM = DATA / "vllm_bench" / "serve_result.json"
AIPERF = DATA / "aiperf" / AIPERF_JSON
GUIDELLM = DATA / "guidellm" / "benchmarks.json"


def test_aiperfs_keys_land_in_our_columns():
    theirs = json.loads(AIPERF.read_text())
    [row] = read_foreign(AIPERF)
    assert row["tool"] == "aiperf 0.13.0" and row["engine"] == "instrument" and row["load"] == "conc=2"
    assert row["requests"] == 6 and row["errors"] == 0 and row["valid"]
    assert row["ttft_p50_ms"] == pytest.approx(theirs["time_to_first_token"]["p50"])
    assert row["ttft_p99_ms"] == pytest.approx(theirs["time_to_first_token"]["p99"])
    # AIPerf's inter_token_latency is a request's (latency - TTFT) / (tokens - 1): our TPOT; its chunk gaps: our ITL.
    assert row["tpot_p50_ms"] == pytest.approx(theirs["inter_token_latency"]["p50"])
    assert row["itl_p50_ms"] == pytest.approx(theirs["inter_chunk_latency"]["p50"])
    assert row["e2e_p99_ms"] == pytest.approx(theirs["request_latency"]["p99"])
    assert row["req_s"] == pytest.approx(theirs["request_throughput"]["avg"])
    assert row["output_tok_s"] == pytest.approx(theirs["output_token_throughput"]["avg"])
    assert row["goodput_req_s"] == pytest.approx(theirs["goodput"]["avg"]) and row["slo_attainment"] == 1.0
    assert row["cache_hit_rate"] is None  # AIPerf does not measure it: missing, not 0


def test_an_aiperf_artifact_folder_reads_as_its_aggregate_file_and_units_convert(tmp_path):
    folder = tmp_path / "artifacts"
    folder.mkdir()
    shutil.copy(AIPERF, folder / AIPERF_JSON)
    [row] = read_foreign(folder)
    assert row["run_id"] == "artifacts" and row["ttft_p99_ms"] == read_foreign(AIPERF)[0]["ttft_p99_ms"]
    data = json.loads(AIPERF.read_text())
    data["request_latency"] = {**data["request_latency"], "unit": "sec", "p99": 0.5}
    assert foreign_rows(data, "x", "x.json")[0]["e2e_p99_ms"] == pytest.approx(500.0)


def test_guidellms_benchmarks_are_one_row_each_in_our_units():
    theirs = json.loads(GUIDELLM.read_text())["benchmarks"]
    rows = read_foreign(GUIDELLM)
    assert [row["load"] for row in rows] == ["conc=1", "conc=2"]
    for row, benchmark in zip(rows, theirs):
        metrics = benchmark["metrics"]
        assert row["tool"] == "guidellm 0.8.1" and row["engine"] == "instrument"
        assert row["workload"] == "synthetic_text isl=16,osl=4" and row["requests"] == 6 and row["errors"] == 0
        assert row["ttft_p99_ms"] == pytest.approx(
            metrics["time_to_first_token_ms"]["successful"]["percentiles"]["p99"]
        )
        assert row["tpot_p50_ms"] == pytest.approx(
            metrics["inter_token_latency_ms"]["successful"]["percentiles"]["p50"]
        )
        # guidellm's request latency is in seconds, ours in ms
        assert row["e2e_p99_ms"] == pytest.approx(1e3 * metrics["request_latency"]["successful"]["percentiles"]["p99"])
        assert row["req_s"] == pytest.approx(metrics["requests_per_second"]["total"]["mean"])
        assert row["output_tok_s"] == pytest.approx(metrics["output_tokens_per_second"]["total"]["mean"])
        assert row["goodput_req_s"] == pytest.approx(metrics["request_goodput"]["total"]["mean"])
        assert row["slo_attainment"] == metrics["slo_attainment"]
    assert rows[0]["run_id"] != rows[1]["run_id"]


def test_vllms_keys_land_in_our_columns():
    theirs = json.loads(VLLM.read_text())
    [row] = read_foreign(VLLM)
    assert row["tool"] == "vllm bench" and row["load"] == "rps=20.0,max=2"
    assert row["ttft_p99_ms"] == pytest.approx(theirs["p99_ttft_ms"])
    assert row["tpot_p50_ms"] == pytest.approx(theirs["median_tpot_ms"])
    assert row["e2e_p99_ms"] == pytest.approx(theirs["p99_e2el_ms"])
    assert row["goodput_req_s"] == pytest.approx(theirs["request_goodput"])
    assert row["ttft_p90_ms"] is None  # vLLM wrote only its --metric-percentiles 50,99


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"hello": 1}', "not a result file kvbench reads; expected a kvbench run folder"),
        ("not json", "not JSON"),
        (
            '{"aiperf_version": "0.13.0", "request_count": {"avg": 6}, "time_to_first_token": {"unit": "ms", "p99": "fast"}}',
            "time_to_first_token.p99: expected `float | null`, got `str`",
        ),
        (
            '{"aiperf_version": "0.13.0", "request_count": {"avg": 6}, "time_to_first_token": {"unit": "fortnights", "p99": 1}}',
            "time_to_first_token.unit is 'fortnights'",
        ),
        (
            '{"metadata": {"guidellm_version": "0.8.1"}, "benchmarks": []}',
            "benchmarks: expected `array` of length >= 1",
        ),
        (
            '{"metadata": {"guidellm_version": "0.8.1"}, "benchmarks": [{"metrics": {"request_totals": {"successful": -1}}}]}',
            "metrics.request_totals.successful is -1; expected a count",
        ),
    ],
)
def test_a_bad_or_unknown_file_is_one_line_naming_it_and_what_is_expected(tmp_path, capsys, text, expected):
    from kvbench.cli.main import main

    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(ForeignResultError, match="bad.json"):
        read_foreign(bad)
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(bad) in err.replace("\n", "") and len(err.strip().splitlines()) <= 2


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_report_table_labels_every_tool_and_never_cuts_a_number(width, capsys):
    from kvbench.cli.commands.report_cmd import report_columns
    from kvbench.cli.tables import _fmt, print_frame
    from kvbench.measure.report import summary_frame

    frames = []
    for path in (VLLM, AIPERF, GUIDELLM):
        frame = pd.DataFrame(read_foreign(path), columns=[*summary_frame([]).columns, "tool"])
        frame.insert(0, "run_dir", path.name)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None)
    columns = report_columns(table)
    assert {"tpot_p50_ms", "e2e_p99_ms", "req_s", "goodput_req_s"} <= set(columns)
    print_frame(console, table, columns, keys=2)
    out = buffer.getvalue()
    assert max(len(line) for line in out.splitlines()) <= width
    for tool in ("vllm bench", "aiperf 0.13.0", "guidellm 0.8.1"):
        assert tool in out
    for _, row in table.iterrows():
        for column in ("ttft_p99_ms", "tpot_p50_ms", "e2e_p99_ms", "req_s", "output_tok_s"):
            assert _fmt(column, row[column]) in out  # whole, never '...'
    assert "…" not in out and "..." not in out


def test_a_folder_that_is_no_run_and_a_missing_path_say_what_report_reads(tmp_path, capsys):
    from kvbench.cli.main import main

    assert main(["report", str(tmp_path)]) == 2
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    first, second = capsys.readouterr().err.strip().splitlines()
    assert "no summary.json and no requests.jsonl; expected a kvbench run folder" in first
    assert "nowhere: no such file or folder; expected" in second and "guidellm's benchmarks.json" in second
