"""`kvbench validate-sim` on a real run folder of our engine: hit rates equal, every row written, and simulated
TTFT within the error the committed calibration measured."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvbench.cli.main import main
from kvbench.engines.kvengine.runtime.step_probe import read_step_log
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.measure.run_folder import read_entries
from kvbench.sim.cost import CostModel, SeqWork
from kvbench.sim.hardware import load_hardware, save_hardware
from kvbench.sim.validate import WEIGHT_DTYPES, engine_geometry

VALIDATION = Path(__file__).resolve().parents[2] / "results" / "sim" / "validation"


@pytest.mark.slow
def test_validate_sim_reproduces_the_cache_hit_rate_of_a_real_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--set",
                "model=tiny-random",
                "--set",
                "kv_capacity=1280",
                "--num-sessions",
                "4",
                "--concurrency",
                "1",
                "--max-lag-ms",
                "1000",
                "--out",
                str(run),
            ]
        )
        == 0
    )  # lag: not this test's subject
    # The engine timed its prefill budget beside decodes (auto, the default) and stated it; the run kept it,
    # and the simulator below schedules with it.
    (entry,) = read_entries(run)
    assert entry.engine_settings.get("max_prefill_beside_decodes", "auto") == "auto"
    assert isinstance(entry.prefill_beside_decodes, int) and entry.prefill_beside_decodes >= 1
    # The engine logged its steps; the profile is fitted to them.
    steps = run / "engines" / "kvengine" / "steps.jsonl"
    profile = tmp_path / "cpu-fitted.json"
    assert main(["calibrate", "--model", "tiny-random", "--steps", str(steps), "--out", str(profile)]) == 0
    fitted = load_hardware(str(profile))
    assert fitted.device.flops_efficiency != load_hardware("cpu").device.flops_efficiency
    # This test is about cache decisions: tiny-random's TTFT here is ~20 ms, half of it HTTP and tokenizing
    # that the cost model does not time (sim/real ~0.5), so TTFT is judged on the committed runs below.
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


def calibration_error() -> float:
    """The committed calibration's measured error: the largest |predicted / measured - 1| of any step of the
    calibration run (results/sim/validation/calibration-run, our engine serving SmolLM2-135M on this CPU)
    under the profile fitted to it (cpu-calibrated.json); 0.63 when written. A TTFT is a sum of steps (its
    queueing and its prefill), so a simulated TTFT whose cache decisions are the real ones (checked exactly)
    is off by a weighted mean of its steps' errors, never more than the largest."""
    settings = EngineConfig()  # the calibration run's engine settings: the defaults, kv_capacity aside
    hardware = load_hardware(str(VALIDATION / "cpu-calibrated.json"))
    model = CostModel(
        engine_geometry(settings.model, None),
        hardware,
        settings.kv_dtype.value,
        WEIGHT_DTYPES.get(settings.compute_dtype, "fp32"),
        True,
        settings.page_size,
    )
    steps = [
        s
        for s in read_step_log(VALIDATION / "calibration-run" / "engines" / "kvengine" / "steps.jsonl")
        if s.work and s.seconds > 0
    ]
    predicted = np.array([model.step(SeqWork(a, b) for a, b in s.work).seconds for s in steps])
    return float(np.abs(predicted / np.array([s.seconds for s in steps]) - 1).max())


def test_simulated_ttft_of_the_committed_runs_is_within_the_calibration_error(tmp_path):
    tolerance = calibration_error()
    assert 0 < tolerance < 1
    run = tmp_path / "validation-run"
    shutil.copytree(VALIDATION / "validation-run", run)
    profile = str(VALIDATION / "cpu-calibrated.json")
    assert main(["validate-sim", str(run), "--hardware", profile, "--tolerance", f"{tolerance:.4f}"]) == 0
    runs = json.loads((run / "sim-validation.json").read_text())["runs"]
    assert len(runs) == 3
    for result in runs:
        rows = {row["name"]: row for row in result["metrics"]}
        for name in ("TTFT p50 ms", "TTFT p99 ms"):
            assert rows[name]["ok"] is True and rows[name]["tolerance"] == pytest.approx(tolerance, abs=1e-4)
    # The bound bites: a device at half the fitted speed puts simulated TTFT outside it.
    slow = load_hardware(profile)
    device = dataclasses.replace(
        slow.device, flops_efficiency=slow.device.flops_efficiency / 2, bw_efficiency=slow.device.bw_efficiency / 2
    )
    save_hardware(dataclasses.replace(slow, device=device), tmp_path / "slow.json")
    assert (
        main(["validate-sim", str(run), "--hardware", str(tmp_path / "slow.json"), "--tolerance", f"{tolerance:.4f}"])
        == 1
    )
