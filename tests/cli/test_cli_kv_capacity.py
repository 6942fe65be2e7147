"""summary.json records the device KV the engine allocated, as the engine states it, not the setting."""

from __future__ import annotations

import json
import re

import pytest

from kvbench.cli.commands.run_cmd import MAIN_JOB_KV_BYTES
from kvbench.cli.main import main


@pytest.mark.slow
def test_the_main_job_records_each_rows_own_kv_capacity(tmp_path):
    # The main job: fp32 and fp8_e4m3 in the same bytes of device KV, so each row holds its own token count.
    out = tmp_path / "run"
    # (--max-lag-ms: this test is not about the client's lag, which a loaded test machine can push past 10 ms)
    code = main(
        [
            "run",
            "--set",
            "model=tiny-random",
            "--num-sessions",
            "1",
            "--num-requests",
            "1",
            "--max-lag-ms",
            "1000",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    entries = json.loads((out / "summary.json").read_text())["runs"]
    assert [entry["engine"] for entry in entries] == ["kvengine-fp32", "kvengine-fp8_e4m3"]
    tokens = {}
    for entry in entries:
        log = (out / "engines" / entry["engine"] / "engine.log").read_text()
        # The engine's own memory budget line: "... KV 0.09 GB for 2,176 tokens ...".
        logged = int(re.search(r"KV [\d.]+ GB for ([\d,]+) tokens", log).group(1).replace(",", ""))
        capacity = entry["kv_capacity"]
        assert capacity["source"] == "kvbench:kv_capacity_tokens"
        assert capacity["tokens"] == logged
        assert 0 < capacity["bytes"] <= MAIN_JOB_KV_BYTES
        assert "kv_capacity" not in entry["engine_description"]  # the setting is not passed off as the capacity
        tokens[entry["engine"]] = capacity["tokens"]
    assert tokens["kvengine-fp8_e4m3"] > 3 * tokens["kvengine-fp32"]  # 1 byte a value against 4 (and scales)
