"""Fit a hardware profile to measured engine steps: the efficiencies and per-step overhead of the cost model.

The cost model times a step as `busy(compute_s / flops_eff, memory_s / bw_eff) + overhead`, where
compute_s and memory_s are the step's FLOPs and bytes at the device's peak rates and `busy` is `max` when
the device overlaps compute with memory traffic (GPU kernels) and `+` when it does not (see
`Device.overlap`). Given steps measured on a real engine (each step's token ranges and wall seconds), the
fit picks the two efficiencies (at most 1) and the overhead (at least 0) by least squares on
(predicted - measured)^2 / measured, which weighs long steps more than short ones but every step's
relative error alike. With `+` the model is linear in (1/flops_eff, 1/bw_eff, overhead); with `max` it is
linear once each step is known to be compute- or memory-bound, so the fit alternates the two.

The measured steps come from anything with `work` ((start, end) per sequence) and `seconds`: our engine's
`runtime.step_probe` produces them (probed in-process, or logged while serving); this module does not import
the engine.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
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

    def at_bound(self) -> list[str]:
        """Fitted values pinned at a bound of the search: the profile's peak numbers are then off."""
        device = self.hardware.device
        return [
            name
            for name, value in (("flops_efficiency", device.flops_efficiency), ("bw_efficiency", device.bw_efficiency))
            if value >= 1.0 - 1e-9
        ]


def fit_hardware(
    hardware: Hardware,
    geometry: ModelGeometry,
    kv_dtype: str,
    weight_dtype: str | None,
    steps: Sequence[TimedStep],
    padded_attention: bool = False,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> Calibration:
    """The profile whose cost model best predicts `steps` (see the module docstring)."""
    steps = [s for s in steps if s.work and s.seconds > 0]
    if len(steps) < 3:
        raise HardwareError(f"calibration needs at least 3 timed model steps, got {len(steps)}")
    unit = _unit(hardware)
    model = CostModel(geometry, unit, kv_dtype, weight_dtype, padded_attention, page_size)
    costs = [model.step(SeqWork(a, b) for a, b in s.work) for s in steps]
    compute = np.array([c.compute_s for c in costs])
    memory = np.array([c.memory_s for c in costs])
    measured = np.array([s.seconds for s in steps]) - np.array([c.comm_s for c in costs])
    if hardware.device.overlap:
        # max(c/fe, m/be) is linear once each step is known to be compute- or memory-bound: alternate.
        bound = compute >= memory * (hardware.device.flops_efficiency / hardware.device.bw_efficiency)
        for _ in range(20):
            x, y, o = _least_squares(np.where(bound, compute, 0.0), np.where(bound, 0.0, memory), measured)
            new_bound = compute * x >= memory * y
            if (new_bound == bound).all():
                break
            bound = new_bound
    else:
        x, y, o = _least_squares(compute, memory, measured)
    fe, be = 1.0 / x, 1.0 / y
    device = dataclasses.replace(hardware.device, flops_efficiency=fe, bw_efficiency=be)
    fitted = dataclasses.replace(hardware, device=device, step_overhead_s=o)
    final = CostModel(geometry, fitted, kv_dtype, weight_dtype, padded_attention, page_size)
    predicted = tuple(final.step(SeqWork(a, b) for a, b in s.work).seconds for s in steps)
    return Calibration(fitted, tuple(float(s.seconds) for s in steps), predicted)


def _least_squares(compute: np.ndarray, memory: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    """(x, y, o) minimizing sum((compute*x + memory*y + o - t)^2 / t) with x, y >= 1 (efficiency <= 1) and
    o >= 0: every way of pinning parameters at their bound is solved, the best feasible one kept (3
    parameters: 8 small solves)."""
    lower = np.array([1.0, 1.0, 0.0])
    columns = np.stack([compute, memory, np.ones_like(measured)], axis=1)
    scale = 1.0 / np.sqrt(measured)
    best, best_error = lower, np.inf
    for pinned in itertools.product((False, True), repeat=3):
        free = [i for i in range(3) if not pinned[i]]
        params = lower.copy()
        rest = measured - columns[:, list(np.flatnonzero(pinned))] @ lower[list(np.flatnonzero(pinned))]
        if free:
            solution, *_ = np.linalg.lstsq(columns[:, free] * scale[:, None], rest * scale, rcond=None)
            params[free] = solution
        if (params < lower - 1e-12).any() or not np.isfinite(params).all():
            continue
        error = float((((columns @ params) - measured) ** 2 / measured).sum())
        if error < best_error:
            best, best_error = params, error
    return float(best[0]), float(best[1]), float(best[2])


def _unit(hardware: Hardware) -> Hardware:
    """The profile at peak rates and no per-step overhead: the cost model then reports raw seconds."""
    device = dataclasses.replace(hardware.device, flops_efficiency=1.0, bw_efficiency=1.0)
    return dataclasses.replace(hardware, device=device, step_overhead_s=0.0)
