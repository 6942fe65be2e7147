"""Fit a hardware profile to measured engine steps: the efficiencies and per-step overhead of the cost model.

The cost model times a step as `busy(compute_s / flops_eff, memory_s / bw_eff) + overhead`, where
compute_s and memory_s are the step's FLOPs and bytes at the device's peak rates and `busy` is `max` when
the device overlaps compute with memory traffic (GPU kernels) and `+` when it does not (see
`Device.overlap`). Given steps measured on a real engine (each step's token ranges and wall seconds), the
fit picks the two efficiencies and the overhead that minimize the time-weighted squared log error, by a
coarse grid and then a fine one around the best point (three parameters, a few hundred samples: exact
enough, no optimizer needed).

The measured steps come from anything with `work` ((start, end) per sequence) and `seconds`: our engine's
`runtime.step_probe.probe_steps` produces them; this module does not import the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvbench.sim.cost import CostModel, SeqWork
from kvbench.sim.geometry import ModelGeometry
from kvbench.sim.hardware import Hardware, HardwareError


class TimedStep(Protocol):
    """One measured engine step: token ranges [start, end) per sequence, and its wall seconds."""

    @property
    def work(self) -> Sequence[tuple[int, int]]: ...

    @property
    def seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Calibration:
    hardware: Hardware  # the input profile with the fitted efficiencies and step overhead
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]  # by the fitted profile, in the input's order

    @property
    def total_error(self) -> float:
        """Predicted over measured total step time, minus one (0.0: the totals agree)."""
        return sum(self.predicted_s) / sum(self.measured_s) - 1.0

    def at_bound(self) -> list[str]:
        """Fitted values pinned at a bound of the search: the profile's peak numbers are then off."""
        device = self.hardware.device
        return [name for name, value in (("flops_efficiency", device.flops_efficiency),
                                         ("bw_efficiency", device.bw_efficiency)) if value >= _MAX_EFFICIENCY]


_MAX_EFFICIENCY = 1.0
_MIN_EFFICIENCY = 1e-4


def fit_hardware(hardware: Hardware, geometry: ModelGeometry, kv_dtype: str, weight_dtype: str | None,
                 steps: Sequence[TimedStep]) -> Calibration:
    """The profile whose cost model best predicts `steps` (see the module docstring)."""
    steps = [s for s in steps if s.work and s.seconds > 0]
    if len(steps) < 3:
        raise HardwareError(f"calibration needs at least 3 timed model steps, got {len(steps)}")
    unit = _unit(hardware)
    model = CostModel(geometry, unit, kv_dtype, weight_dtype)
    costs = [model.step(SeqWork(a, b) for a, b in s.work) for s in steps]
    compute = np.array([c.compute_s for c in costs])
    memory = np.array([c.memory_s for c in costs])
    comm = np.array([c.comm_s for c in costs])
    measured = np.array([s.seconds for s in steps])
    weights = measured / measured.sum()
    overlap = hardware.device.overlap

    def search(fe: np.ndarray, be: np.ndarray, overheads: np.ndarray) -> tuple[float, float, float, float]:
        best = (np.inf, 1.0, 1.0, 0.0)
        c = compute[None, None, :] / fe[:, None, None]
        m = memory[None, None, :] / be[None, :, None]
        busy = np.maximum(c, m) if overlap else c + m
        for o in overheads:
            predicted = busy + comm + o
            error = (weights * np.log(predicted / measured) ** 2).sum(axis=2)
            i, j = np.unravel_index(np.argmin(error), error.shape)
            if error[i, j] < best[0]:
                best = (float(error[i, j]), float(fe[i]), float(be[j]), float(o))
        return best

    coarse = search(np.geomspace(_MIN_EFFICIENCY, _MAX_EFFICIENCY, 81), np.geomspace(_MIN_EFFICIENCY, _MAX_EFFICIENCY, 81),
                    np.linspace(0.0, 0.95 * measured.min(), 39))
    _, fe, be, o = coarse
    step_o = 0.95 * measured.min() / 38
    fine = search(np.clip(np.geomspace(fe / 1.2, fe * 1.2, 41), _MIN_EFFICIENCY, _MAX_EFFICIENCY),
                  np.clip(np.geomspace(be / 1.2, be * 1.2, 41), _MIN_EFFICIENCY, _MAX_EFFICIENCY),
                  np.clip(np.linspace(o - step_o, o + step_o, 21), 0.0, None))
    _, fe, be, o = min(coarse, fine)
    device = dataclasses.replace(hardware.device, flops_efficiency=fe, bw_efficiency=be)
    fitted = dataclasses.replace(hardware, device=device, step_overhead_s=o)
    final = CostModel(geometry, fitted, kv_dtype, weight_dtype)
    predicted = tuple(final.step(SeqWork(a, b) for a, b in s.work).seconds for s in steps)
    return Calibration(fitted, tuple(float(x) for x in measured), predicted)


def _unit(hardware: Hardware) -> Hardware:
    """The profile at peak rates and no per-step overhead: the cost model then reports raw seconds."""
    device = dataclasses.replace(hardware.device, flops_efficiency=1.0, bw_efficiency=1.0)
    return dataclasses.replace(hardware, device=device, step_overhead_s=0.0)
