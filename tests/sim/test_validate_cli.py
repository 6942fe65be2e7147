"""`kvbench validate-sim` on a real run folder of our engine: hit rates equal, every row written."""

import json

from kvbench.cli.main import main
from kvbench.sim.hardware import load_hardware


def test_validate_sim_reproduces_the_cache_hit_rate_of_a_real_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", "--set", "model=tiny-random", "--set", "kv_capacity=1280", "--num-sessions", "4",
                 "--concurrency", "1", "--out", str(run)]) == 0
    # The engine logged its steps; the profile is fitted to them.
    steps = run / "engines" / "kvengine" / "steps.jsonl"
    profile = tmp_path / "cpu-fitted.json"
    assert main(["calibrate", "--model", "tiny-random", "--steps", str(steps), "--out", str(profile)]) == 0
    fitted = load_hardware(str(profile))
    assert fitted.device.flops_efficiency != load_hardware("cpu").device.flops_efficiency
    # A huge TTFT tolerance: this test is about cache decisions, not this machine's speed.
    code = main(["validate-sim", str(run), "--hardware", str(profile), "--tolerance", "1e9"])
    assert code == 0
    result = json.loads((run / "sim-validation.json").read_text())["runs"][0]
    rows = {row["name"]: row for row in result["metrics"]}
    assert rows["cache hit rate"]["ok"] is True and rows["cache hit rate"]["real"] > 0
    assert rows["requests completed"]["real"] == rows["requests completed"]["sim"] > 0
    assert result["same_cached_tokens"] == result["compared_requests"] == rows["requests completed"]["real"]
    assert rows["TTFT p50 ms"]["sim"] > 0 and rows["TTFT p99 ms"]["real"] > 0
    assert "real engine vs simulator" in capsys.readouterr().out


def test_a_folder_without_our_engine_is_a_clear_error(tmp_path, capsys):
    code = main(["validate-sim", str(tmp_path)])
    assert code == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "config.yaml is missing" in err and "kvbench run" in err
