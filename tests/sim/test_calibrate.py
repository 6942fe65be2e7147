"""Fitting a hardware profile to measured steps: it recovers a known truth, for both overlap models."""

import dataclasses

import pytest

from kvbench.sim.calibrate import fit_hardware
from kvbench.sim.cost import CostModel, SeqWork
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import HardwareError, load_hardware

SMOL = load_geometry("smollm2-135m")


@dataclasses.dataclass(frozen=True)
class Step:
    work: tuple[tuple[int, int], ...]
    seconds: float


# Prefill chunks, chunks over a cached context, decode batches at short and long contexts, a mixed step.
SHAPES = (
    ((0, 64),),
    ((0, 256),),
    ((0, 512),),
    ((512, 1024),),
    ((1536, 2048),),
    ((130, 131),),
    ((2000, 2001),),
    tuple((128 + i, 129 + i) for i in range(8)),
    ((500, 501),) * 4,
    ((0, 300), (700, 701), (900, 901)),
)


def measured_on(truth) -> list[Step]:
    model = CostModel(SMOL, truth, "fp32", "fp32")
    return [Step(work, model.step(SeqWork(a, b) for a, b in work).seconds) for work in SHAPES]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_fit_recovers_the_efficiencies_and_overhead_of_a_known_device(overlap):
    cpu = load_hardware("cpu")
    start = dataclasses.replace(cpu, device=dataclasses.replace(cpu.device, overlap=overlap))
    device = dataclasses.replace(start.device, flops_efficiency=0.62, bw_efficiency=0.27)
    truth = dataclasses.replace(start, device=device, step_overhead_s=0.004)
    fit = fit_hardware(start, SMOL, "fp32", "fp32", measured_on(truth))
    assert fit.hardware.device.flops_efficiency == pytest.approx(0.62, rel=0.03)
    assert fit.hardware.device.bw_efficiency == pytest.approx(0.27, rel=0.03)
    assert fit.hardware.step_overhead_s == pytest.approx(0.004, abs=0.0005)
    for predicted, measured in zip(fit.predicted_s, fit.measured_s):
        assert predicted == pytest.approx(measured, rel=0.03)
    assert fit.at_bound() == []


def test_a_device_faster_than_its_profile_says_is_reported_at_the_bound():
    cpu = load_hardware("cpu")
    fast = dataclasses.replace(cpu.device, flops_bf16=cpu.device.flops_bf16 * 10, flops_efficiency=0.5)
    truth = dataclasses.replace(cpu, device=fast)
    fit = fit_hardware(cpu, SMOL, "fp32", "fp32", measured_on(truth))
    assert "flops_efficiency" in fit.at_bound()


def test_too_few_steps_is_a_clear_error():
    with pytest.raises(HardwareError, match="at least 3 timed model steps"):
        fit_hardware(load_hardware("cpu"), SMOL, "fp32", "fp32", [Step(((0, 8),), 0.1)])


def test_calibrate_fits_the_h200_profile_to_a_gpu_runs_step_log_and_drops_the_assumption_label(tmp_path):
    """The GPU path of `kvbench calibrate`: a steps.jsonl in the engine's step-probe format (as our engine
    logs it on any device), here written by a known H200 (efficiencies 0.62 / 0.71, 3 ms overhead, compute and
    memory overlapped), fits the built-in h200 profile, whose shipped efficiencies are labelled assumptions."""
    import json

    from kvbench.cli.main import main

    h200 = load_hardware("h200")
    assert h200.fitted_on is None and h200.assumptions().startswith("assumption:")
    device = dataclasses.replace(h200.device, flops_efficiency=0.62, bw_efficiency=0.71)
    truth = dataclasses.replace(h200, device=device, step_overhead_s=0.003)
    model = CostModel(SMOL, truth, "bf16", "bf16", padded_attention=False)  # our engine reads live tokens only
    log = tmp_path / "steps.jsonl"
    with open(log, "w") as out:
        for work in SHAPES + (((0, 4096),), ((0, 8192),), tuple((4000 + i, 4001 + i) for i in range(64))):
            seconds = model.step(SeqWork(a, b) for a, b in work).seconds
            out.write(json.dumps({"work": [list(w) for w in work], "seconds": seconds}) + "\n")
    profile = tmp_path / "h200.json"
    assert (
        main(
            [
                "calibrate",
                "--steps",
                str(log),
                "--hardware",
                "h200",
                "--geometry",
                "smollm2-135m",
                "--compute-dtype",
                "bfloat16",
                "--kv-dtype",
                "bf16",
                "--out",
                str(profile),
            ]
        )
        == 0
    )
    fitted = load_hardware(str(profile))
    assert fitted.device.overlap is True
    assert fitted.device.flops_efficiency == pytest.approx(0.62, rel=0.05)
    assert fitted.device.bw_efficiency == pytest.approx(0.71, rel=0.05)
    assert fitted.step_overhead_s == pytest.approx(0.003, abs=0.0005)
    assert str(log) in fitted.fitted_on and not fitted.assumptions().startswith("assumption:")
