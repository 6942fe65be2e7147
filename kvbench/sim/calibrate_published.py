"""Fit the simulator's device speeds to a published case: part of its ladder fitted, the rest only checked.

The fitted values are the cost model's FLOP/s efficiency, bandwidth efficiency and per-step overhead
(`hardware.Device`, `Hardware.step_overhead_s`), plus the router's per-request latency (an endpoint picker
tokenizes and scores every request before it reaches a replica: it is in the published TTFT and in no engine
step). They are fitted on one router's stages up to a rate (by default precise-prefix at <= 20/s) by least
squares (`scipy.optimize.least_squares`, finite differences) over the log ratios simulated / published of
output tok/s, TTFT mean and TTFT p90 of those stages, each stage a full simulation of the ladder up to it. Two
weak priors (log efficiency 0.1 from 0.5 and 0.8, weight 0.1) keep FLOP efficiency and router latency from
trading off freely: both move TTFT. Everything else (the other router's ladder, the fitted router above the
rate) is checked with the fitted values, not refitted (`kvbench validate-published --fit`).

A profile for another device takes the same efficiencies (fractions of its own datasheet peaks) and overhead:
`transfer` writes e.g. an H200 profile from an H100 fit; its speeds then differ from the H100's by the datasheet
ratios (bandwidth 4.8 / 3.35 TB/s, dense bf16 989 / 989 TFLOP/s).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from kvbench.sim.hardware import Hardware
from kvbench.sim.presets import ROUTE_PRECISE_PREFIX
from kvbench.sim.published import Case, Fit, Row, case_config, case_workload, compare_route, log_residuals

FIT_METRICS = ("output_tok_s", "ttft_mean_s", "ttft_p90_s")
START = Fit(flops_efficiency=0.5, bw_efficiency=0.8, step_overhead_s=0.002, router_latency_s=0.05)
PRIOR_WEIGHT = 0.1


@dataclass(frozen=True, slots=True)
class Evaluation:
    fit: Fit
    rows: tuple[Row, ...]
    cost: float  # sum of squared residuals (priors included)
    wall_s: float


@dataclass(frozen=True, slots=True)
class PublishedFit:
    fit: Fit
    rows: tuple[Row, ...]  # the fitted stages, simulated with the fit (their ratios are the residuals)
    evaluations: tuple[Evaluation, ...]
    route: str
    max_rate: float
    wall_s: float

    def to_dict(self) -> dict:
        return {"fit": dataclasses.asdict(self.fit), "fitted_on": {"route": self.route, "max_rate": self.max_rate,
                                                                   "metrics": list(FIT_METRICS)},
                "residuals": [{"stage": r.stage, "metric": r.metric, "published": r.published,
                               "simulated": r.simulated, "ratio": r.ratio} for r in self.rows],
                "evaluations": [{**dataclasses.asdict(e.fit), "cost": e.cost, "wall_s": e.wall_s}
                                for e in self.evaluations],
                "wall_s": self.wall_s}


def _fit_of(x: np.ndarray, fitted_on: str) -> Fit:
    return Fit(float(math.exp(x[0])), float(math.exp(x[1])), float(x[2]) / 1e3, float(x[3]) / 1e3, fitted_on)


def fit_published(case: Case, route: str = ROUTE_PRECISE_PREFIX, max_rate: float = 20.0, start: Fit = START,
                  max_evaluations: int = 30, seed: int = 0,
                  on_evaluation: Callable[[Evaluation], None] | None = None) -> PublishedFit:
    """The fit of the module docstring on `route`'s stages at rates <= `max_rate`."""
    subset = [i for i, s in enumerate(case.plan.stages) if s.rate <= max_rate]
    if not subset:
        raise ValueError(f"no stage of {case.name} at <= {max_rate:g}/s to fit on")
    if route not in case.published:
        raise ValueError(f"{case.name} publishes nothing for {route!r}")
    started = time.perf_counter()
    fitted_on = f"{case.name}: {route} stages <= {max_rate:g}/s ({case.path.name})"
    workload = case_workload(case, case_config(case, route).geometry.vocab_size, seed)
    evaluations: list[Evaluation] = []
    cache: dict[tuple, np.ndarray] = {}

    def residuals(x: np.ndarray) -> np.ndarray:
        key = tuple(np.round(x, 6))
        if key in cache:
            return cache[key]
        fit = _fit_of(x, fitted_on)
        t = time.perf_counter()
        run = compare_route(case, route, fit, seed, stage_subset=subset, workload=workload)
        res = log_residuals(run.rows, FIT_METRICS)
        priors = [PRIOR_WEIGHT * (x[0] - math.log(START.flops_efficiency)),
                  PRIOR_WEIGHT * (x[1] - math.log(START.bw_efficiency))]
        out = np.array(res + priors)
        evaluation = Evaluation(fit, run.rows, float((out ** 2).sum()), time.perf_counter() - t)
        evaluations.append(evaluation)
        if on_evaluation is not None:
            on_evaluation(evaluation)
        cache[key] = out
        return out

    x0 = np.array([math.log(start.flops_efficiency), math.log(start.bw_efficiency), start.step_overhead_s * 1e3,
                   start.router_latency_s * 1e3])
    lower = np.array([math.log(0.05), math.log(0.05), 0.0, 0.0])
    upper = np.array([0.0, 0.0, 50.0, 2000.0])
    solution = least_squares(residuals, x0, bounds=(lower, upper), diff_step=0.03, max_nfev=max_evaluations,
                             x_scale=np.array([0.1, 0.1, 1.0, 20.0]))
    best = min(evaluations, key=lambda e: e.cost)  # the solver's x, or a better point it tried on the way
    if not np.isfinite(solution.cost):
        raise ValueError("the fit did not converge")
    return PublishedFit(best.fit, best.rows, tuple(evaluations), route, max_rate, time.perf_counter() - started)


def transfer(fit: Fit, hardware: Hardware) -> Hardware:
    """`hardware` (another device) with the fit's efficiencies of its own peaks and the fit's step overhead."""
    fitted = fit.apply(hardware)
    return dataclasses.replace(fitted, fitted_on=f"efficiencies of {fit.fitted_on}, carried to {hardware.name} "
                               "through its datasheet peaks")


def residual_lines(rows: Sequence[Row]) -> list[str]:
    return [f"| {r.stage} | {r.metric} | {r.published:g} | {r.simulated:.4g} | {r.ratio:.3f} |"
            for r in rows if r.ratio is not None]
