"""`kvbench run`'s exit code is the whole verdict a CI job reads: 0 every point valid, 1 any point invalid
(whatever made it so), 2 bad input. Against the instrument as its own process, misbehaving as told."""

from __future__ import annotations

import json

from kvbench.cli.main import main
from kvbench.measure.records import read_records

from ..harness.instrument_fixture import instrument_process


def _config(tmp_path, url, client=""):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"engines: [{{engine: endpoint, settings: {{url: '{url}'}}}}]\n"
        "workloads: [{name: rag-chat-mini, num_sessions: 3}]\n"
        f"loads: [{{concurrency: 1}}, {{concurrency: 2}}]\nclient: {{{client}}}\n"
    )
    return config


def _entries(out):
    return json.loads((out / "summary.json").read_text())["runs"]


def test_a_field_no_server_could_send_fails_its_requests_and_every_point_still_runs(tmp_path, capsys):
    out = tmp_path / "run"
    with instrument_process("--override", 'usage.prompt_tokens="lots"') as (url, _):
        code = main(["run", str(_config(tmp_path, url, "max_lag_ms: 1000")), "--out", str(out)])
    assert code == 1
    entries = _entries(out)
    assert [entry["load"] for entry in entries] == ["conc=1", "conc=2"]  # the second point ran after the first
    records = list(read_records(out / "requests.jsonl"))
    assert len({rec.identity for rec in records}) == len(records) == 6  # each session's first turn, once
    error = "bad_answer: usage.prompt_tokens is 'lots', not an integer"
    assert {rec.error for rec in records} == {error}
    for entry in entries:
        assert entry["valid"] is False
        assert entry["summary"]["overall"]["requests"] == 3
        assert f"server answers failed the client's checks: 3/3 requests ({error})" in entry["invalid_reasons"]
    assert "Traceback" not in capsys.readouterr().err


def test_a_point_invalid_only_for_client_lag_exits_1(tmp_path, capsys):
    out = tmp_path / "run"
    # The lag bound is the larger of max_lag_ms and 5% of the point's TTFT p50 (client_check.lag_bound_ms): with a
    # first token at once that share is microseconds, and no event loop wakes within a nanosecond or a few
    # microseconds of its deadline, so the client's own check fails, nothing else (at the instrument's default
    # 20 ms TTFT the bound was 1 ms, which a quiet machine's loop meets).
    with instrument_process("--first-token-ms", "0") as (url, _):
        code = main(["run", str(_config(tmp_path, url, "max_lag_ms: 0.000001")), "--out", str(out)])
    assert code == 1
    for entry in _entries(out):
        assert entry["summary"]["overall"]["errors"] == 0
        assert len(entry["invalid_reasons"]) == 1 and entry["invalid_reasons"][0].startswith("client lag: ")
    assert "INVALID: client lag: " in capsys.readouterr().out


def test_usage_past_the_context_window_the_server_states_is_a_failed_answer(tmp_path):
    out = tmp_path / "run"
    with instrument_process("--max-model-len", "50") as (url, _):  # /v1/models: max_model_len 50
        code = main(["run", str(_config(tmp_path, url, "max_lag_ms: 1000")), "--out", str(out)])
    assert code == 1
    records = list(read_records(out / "requests.jsonl"))
    assert records and all(
        rec.error.startswith("bad_answer: usage.prompt_tokens is ")
        and rec.error.endswith(", past the context bound 50")
        for rec in records
    ), records[0].error
