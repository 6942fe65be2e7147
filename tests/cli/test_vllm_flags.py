"""`kvbench run` speaks `vllm bench serve`'s flags: each parsed into the config as vLLM means it, and goodput
shown in the console table and summary.md."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kvbench.cli.main import main
from kvbench.measure.metrics import SLO
from kvbench.measure.records import RequestRecord
from kvbench.measure.report import write_summaries
from kvbench.measure.run_folder import SUMMARY_MD, PointId, RunEntry

from .test_cli_run import _run_config

MS = 1_000_000


def test_request_rate_and_max_concurrency_are_one_load_point():
    (load,) = _run_config("--request-rate", "2.5", "--max-concurrency", "3", "--burstiness", "0.5").load_specs()
    assert (load.request_rate, load.max_concurrency, load.burstiness, load.rate, load.concurrency) == (
        2.5,
        3,
        0.5,
        None,
        None,
    )
    (load,) = _run_config("--rate", "1", "--max-concurrency", "4").load_specs()
    assert (load.rate, load.max_concurrency) == (1.0, 4)


def test_max_concurrency_alone_is_vllms_infinite_rate_under_the_cap():
    config = _run_config("--max-concurrency", "8")
    assert config.loads[0].request_rate == "inf"  # written to config.yaml as a word, read back as infinity
    (load,) = config.load_specs()
    assert load.request_rate == float("inf") and load.max_concurrency == 8 and load.label == "rps=inf,max=8"
    assert _run_config("--request-rate", "inf").load_specs()[0].request_rate == float("inf")


def test_goodput_takes_vllms_pairs_separated_by_spaces_or_commas():
    assert _run_config("--goodput", "ttft:500", "tpot:50").slo == SLO(ttft_ms=500, tpot_ms=50)
    assert _run_config("--goodput", "ttft:500,e2el:2000").slo == SLO(ttft_ms=500, e2e_ms=2000)
    assert _run_config("--num-prompts", "7").stop.num_requests == 7  # vLLM's name for the request budget


def test_a_yaml_load_point_takes_the_same_keys(tmp_path):
    from kvbench.harness.config import parse_config
    from kvbench.settings import SettingsError

    config = parse_config({"engines": ["kvengine"], "loads": [{"request_rate": 4, "max_concurrency": 2}]})
    assert config.load_specs()[0].label == "rps=4,max=2"
    with pytest.raises(SettingsError, match="loads\\[0\\].*request_rate"):
        parse_config({"engines": ["kvengine"], "loads": [{"request_rate": "fast"}]})
    with pytest.raises(SettingsError, match="loads\\[0\\].*give one of"):
        parse_config({"engines": ["kvengine"], "loads": [{"request_rate": 4, "concurrency": 2}]})


def test_version_prints_the_installed_version():
    out = subprocess.run([sys.executable, "-m", "kvbench.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and re.fullmatch(r"kvbench \d+\.\d+\.\d+\S*\n", out.stdout)


def test_an_unknown_flag_is_named_with_the_closest_one_of_its_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--num-promts", "3", "--slo-ttft", "5"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert "--num-promts: did you mean --num-prompts?" in err
    with pytest.raises(SystemExit):
        main(["plan", "--bogus-thing"])
    assert "did you mean" not in capsys.readouterr().err  # nothing close: no guess


def _record(index, ttft_ms):
    sent = index * 100 * MS
    return RequestRecord(
        run_id="p",
        request_id=f"q{index}",
        session_id=f"s{index}",
        tenant="a",
        turn=0,
        queued_ns=sent,
        sent_ns=sent,
        first_token_ns=sent + ttft_ms * MS,
        done_ns=sent + (ttft_ms + 20) * MS,
        chunks=[[sent + ttft_ms * MS, 1], [sent + (ttft_ms + 20) * MS, 1]],
        prompt_tokens=8,
        output_tokens=2,
        cached_tokens=4,
        reusable_tokens=4,
        answer_source="token_ids",
    )


def test_goodput_and_slo_attainment_are_in_the_table_and_summary_md(tmp_path, capsys):
    """3 of 4 requests meet TTFT <= 100 ms: SLO met 75.0% in both, goodput beside throughput."""
    from kvbench.cli.tables import print_summary

    point = PointId("ours", "w", "rps=2", 0)
    records = [_record(i, ttft) for i, ttft in enumerate([10, 50, 90, 400])]
    entry = RunEntry.of(point, records, SLO(ttft_ms=100), engine_name="kvengine", kv_dtype="fp32")
    frame = write_summaries(tmp_path, [entry])
    md = (tmp_path / SUMMARY_MD).read_text()
    header = next(line for line in md.splitlines() if line.startswith("| engine"))
    assert "goodput_req_s" in header and "slo_attainment" in header
    assert "75.0%" in md
    row = frame.iloc[0]
    assert row.goodput_req_s == pytest.approx(3 / row.duration_s if "duration_s" in frame else 3 * row.req_s / 4)
    print_summary(tmp_path)
    table = capsys.readouterr().out
    assert "goodput req/s" in table and "SLO met" in table and "75.0%" in table
    assert "goodput" not in write_summaries_without_slo(tmp_path / "no-slo", records)


def write_summaries_without_slo(folder, records):
    folder.mkdir()
    write_summaries(folder, [RunEntry.of(PointId("ours", "w", "rps=2", 0), records, SLO())])
    return (folder / SUMMARY_MD).read_text()


def test_percentile_flags_choose_the_tables_percentile_columns(tmp_path, capsys):
    from kvbench.cli.commands.run_cmd import _percentiles
    from kvbench.cli.main import build_parser
    from kvbench.cli.tables import print_summary

    records = [_record(i, ttft) for i, ttft in enumerate([10, 50, 90, 400])]
    write_summaries(tmp_path, [RunEntry.of(PointId("ours", "w", "rps=2", 0), records, SLO())])
    args = build_parser().parse_args(["run", "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,90"])
    print_summary(tmp_path, _percentiles(args))
    table = capsys.readouterr().out
    for title in ("TTFT p50 ms", "TTFT p90 ms", "E2EL p50 ms", "E2EL p90 ms"):
        assert title in table
    assert "ITL p50" not in table and table.count("TTFT p99") == 1  # only "sched. TTFT p99" is left
    assert "307.0" in table  # TTFT p90 of 10, 50, 90, 400 (linear interpolation)


def test_any_percentile_between_0_and_100_is_shown_from_the_per_request_export(tmp_path, capsys):
    """vLLM accepts any 0 < p < 100: p25 and p99.9 are not in the summary; they come from requests_metrics.jsonl
    with the summary's own samples and interpolation."""
    import dataclasses

    import numpy as np

    from kvbench.cli.commands.run_cmd import _percentiles
    from kvbench.cli.main import build_parser
    from kvbench.cli.tables import print_summary
    from kvbench.measure.export import write_exports

    ttfts = [10, 50, 90, 400]
    point = PointId("ours", "w", "rps=2", 0)
    records = [dataclasses.replace(_record(i, ttft), run_id=point.run_id) for i, ttft in enumerate(ttfts)]
    entry = RunEntry.of(point, records, SLO())
    write_summaries(tmp_path, [entry])
    write_exports(tmp_path, [entry], {entry.run_id: records}, {})
    args = build_parser().parse_args(["run", "--percentile-metrics", "ttft", "--metric-percentiles", "25,99.9"])
    frame = print_summary(tmp_path, _percentiles(args))
    table = capsys.readouterr().out
    assert "TTFT p25 ms" in table and "TTFT p99.9 ms" in table
    assert frame["ttft_p99.9_ms"].iloc[0] == pytest.approx(np.percentile(ttfts, 99.9))
    assert f"{np.percentile(ttfts, 25):.1f}" in table and f"{np.percentile(ttfts, 99.9):.1f}" in table
    for bad in ("0", "100", "abc"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--metric-percentiles", bad])


def test_the_default_table_follows_the_percentile_flags_defaults(tmp_path, capsys):
    """No flag: ttft,tpot,itl (--percentile-metrics' default) at the median and p99 (vLLM's console's)."""
    from kvbench.cli.commands.run_cmd import _percentiles
    from kvbench.cli.main import build_parser
    from kvbench.cli.tables import print_summary, summary_columns

    records = [_record(i, ttft) for i, ttft in enumerate([10, 50, 90, 400])]
    write_summaries(tmp_path, [RunEntry.of(PointId("ours", "w", "rps=2", 0), records, SLO())])
    frame = print_summary(tmp_path, _percentiles(build_parser().parse_args(["run"])))
    titles = list(summary_columns(frame, _percentiles(build_parser().parse_args(["run"]))).values())
    assert [title for title in titles if title.endswith(" ms") and " p" in title] == [
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "TPOT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
    ]
    assert "TPOT" in capsys.readouterr().out  # printed, not only chosen
