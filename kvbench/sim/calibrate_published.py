"""Fit the simulator's device speeds to a published case: part of its ladder fitted, the rest only checked.

The fitted values are the cost model's FLOP/s efficiency, bandwidth efficiency and per-step overhead
(`hardware.Device`, `Hardware.step_overhead_s`), plus the router's per-request latency (an endpoint picker
tokenizes and scores every request before it reaches a replica: it is in the published TTFT and in no engine
step). They are fitted on one router's stages up to a rate (by default precise-prefix at <= 20/s) by least
squares over the log ratios simulated / published of output tok/s, TTFT mean and TTFT p90 of those stages, and
optionally of the output tok/s alone of a few saturated stages of that router (`throughput_rates`): light stages
run small batches, whose steps read the weights and little KV, so only a saturated stage's throughput sees what
large-batch steps cost (its TTFT is queueing, which device speeds should not chase). Each evaluation is a
simulation of the warm-up and those stages (a stage left out is not played: a later one starts from the cache
the earlier played ones left). Two weak priors (weight 0.1 on the log distance
from 0.5 and 0.8) keep the efficiencies where the data say little: FLOP efficiency and router latency both
move TTFT, and only their sum is well determined at light load. Everything else (the other router's ladder, the fitted router above the
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
from scipy.optimize import minimize

from kvbench.sim.hardware import Hardware
from kvbench.sim.presets import ROUTE_PRECISE_PREFIX
from kvbench.sim.published import (
    Case,
    Fit,
    Row,
    case_config,
    case_workload,
    compare_arm,
    log_residuals,
)

FIT_METRICS = ("output_tok_s", "ttft_mean_s", "ttft_p90_s")
START = Fit(flops_efficiency=0.5, bw_efficiency=0.8, step_overhead_s=0.002, router_latency_s=0.0)
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
    throughput_rates: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        return {
            "fit": dataclasses.asdict(self.fit),
            "fitted_on": {
                "route": self.route,
                "max_rate": self.max_rate,
                "metrics": list(FIT_METRICS),
                "throughput_rates": list(self.throughput_rates),
            },
            "residuals": [
                {
                    "stage": r.stage,
                    "metric": r.metric,
                    "published": r.published,
                    "simulated": r.simulated,
                    "ratio": r.ratio,
                }
                for r in self.rows
            ],
            "evaluations": [
                {
                    **{k: v for k, v in dataclasses.asdict(e.fit).items() if k != "fitted_rows"},
                    "cost": e.cost,
                    "wall_s": e.wall_s,
                }
                for e in self.evaluations
            ],
            "wall_s": self.wall_s,
        }


def _with_router(rows: Sequence[Row], latency_s: float) -> tuple[Row, ...]:
    """`rows` with `latency_s` added to every simulated TTFT (what a router's latency adds at light load)."""
    return tuple(
        dataclasses.replace(r, simulated=r.simulated + latency_s)
        if r.metric.startswith("ttft") and r.simulated is not None
        else r
        for r in rows
    )


def best_router_latency(rows: Sequence[Row]) -> float:
    """The constant that, added to every simulated TTFT (mean and p90), minimizes the squared log residuals:
    found on a fine grid (the residuals are log(sim + r) - log(pub)), at least 0."""
    pairs = [(r.simulated, r.published) for r in rows if r.metric.startswith("ttft") and r.ratio is not None]
    if not pairs:
        return 0.0
    sim, pub = np.array(pairs).T
    grid = np.linspace(0.0, max(float(pub.max()), 0.0), 2001)
    errors = ((np.log(sim[None, :] + grid[:, None]) - np.log(pub[None, :])) ** 2).sum(axis=1)
    return float(grid[int(errors.argmin())])


def fit_published(
    case: Case,
    route: str = ROUTE_PRECISE_PREFIX,
    max_rate: float = 20.0,
    start: Fit = START,
    max_evaluations: int = 24,
    seed: int = 0,
    on_evaluation: Callable[[Evaluation], None] | None = None,
    throughput_rates: Sequence[float] = (),
) -> PublishedFit:
    """The fit of the module docstring on `route`'s stages at rates <= `max_rate` (and the output tok/s of its
    stages at `throughput_rates`).

    Each evaluation simulates the stages without router latency; the latency that best lifts the simulated
    TTFTs onto the published ones is then solved for exactly (`best_router_latency`: at these loads a constant
    delay before a replica shifts TTFT by itself), and the three device values are searched by Nelder-Mead
    (robust to the small jumps a discrete simulation makes between nearby settings, unlike finite differences)."""
    rates = [s.rate for s in case.plan.stages]
    subset = [i for i, rate in enumerate(rates) if rate <= max_rate]
    if not subset:
        raise ValueError(f"no stage of {case.name} at <= {max_rate:g}/s to fit on")
    missing = [f"{r:g}" for r in throughput_rates if r not in rates]
    if missing:
        raise ValueError(
            f"{case.name} has no stage at {', '.join(missing)}/s (its rates: {', '.join(f'{r:g}' for r in rates)})"
        )
    if route not in case.published:
        raise ValueError(f"{case.name} publishes nothing for {route!r}")
    throughput_only = {f"{r:g}" for r in throughput_rates if r > max_rate}
    subset = sorted(set(subset) | {rates.index(r) for r in throughput_rates})
    started = time.perf_counter()
    fitted_on = f"{case.name}: {route} stages <= {max_rate:g}/s ({case.path.name})"
    if throughput_only:
        fitted_on = (
            f"{case.name}: {route} stages <= {max_rate:g}/s and the output tok/s at "
            f"{', '.join(sorted(throughput_only, key=float))}/s ({case.path.name})"
        )

    def fitted(rows: Sequence[Row]) -> tuple[Row, ...]:
        return tuple(
            r
            for r in rows
            if r.metric in FIT_METRICS and (r.stage not in throughput_only or r.metric == "output_tok_s")
        )

    workload = case_workload(case, case_config(case, route).geometry.vocab_size, seed)
    evaluations: list[Evaluation] = []

    def cost(x: np.ndarray) -> float:
        fe, be, overhead_ms = float(math.exp(min(x[0], 0.0))), float(math.exp(min(x[1], 0.0))), max(float(x[2]), 0.0)
        t = time.perf_counter()
        run = compare_arm(
            case, route, Fit(fe, be, overhead_ms / 1e3, 0.0, fitted_on), seed, stage_subset=subset, workload=workload
        )
        used = fitted(run.rows)
        latency = best_router_latency(used)
        rows = _with_router(used, latency)
        res = log_residuals(rows, FIT_METRICS)
        priors = [
            PRIOR_WEIGHT * (math.log(fe) - math.log(START.flops_efficiency)),
            PRIOR_WEIGHT * (math.log(be) - math.log(START.bw_efficiency)),
        ]
        total = float(sum(r * r for r in res + priors))
        keys = tuple(r.key for r in rows if r.ratio is not None)
        evaluation = Evaluation(
            Fit(fe, be, overhead_ms / 1e3, latency, fitted_on, keys), rows, total, time.perf_counter() - t
        )
        evaluations.append(evaluation)
        if on_evaluation is not None:
            on_evaluation(evaluation)
        return total

    x0 = np.array([math.log(start.flops_efficiency), math.log(start.bw_efficiency), start.step_overhead_s * 1e3])
    simplex = np.array([x0, x0 + [0.15, 0, 0], x0 + [0, 0.1, 0], x0 + [0, 0, 1.0]])
    minimize(
        cost,
        x0,
        method="Nelder-Mead",
        options={"maxfev": max_evaluations, "initial_simplex": simplex, "xatol": 0.01, "fatol": 1e-3},
    )
    best = min(evaluations, key=lambda e: e.cost)
    return PublishedFit(
        best.fit, best.rows, tuple(evaluations), route, max_rate, time.perf_counter() - started, tuple(throughput_rates)
    )


def transfer(fit: Fit, hardware: Hardware) -> Hardware:
    """`hardware` (another device) with the fit's efficiencies of its own peaks and the fit's step overhead."""
    fitted = fit.apply(hardware)
    return dataclasses.replace(
        fitted, fitted_on=f"efficiencies of {fit.fitted_on}, carried to {hardware.name} through its datasheet peaks"
    )


def residual_lines(rows: Sequence[Row]) -> list[str]:
    return [
        f"| {r.stage} | {r.metric} | {r.published:g} | {r.simulated:.4g} | {r.ratio:.3f} |"
        for r in rows
        if r.ratio is not None
    ]


@dataclass(frozen=True, slots=True)
class FitPart:
    """What one case adds to a fit across cases: one arm's stages at rates <= `max_rate` (a closed loop: its
    whole-run throughput and TTFT mean)."""

    case: Case
    arm: str
    max_rate: float


@dataclass(frozen=True, slots=True)
class CasesFit:
    fit: Fit
    rows: tuple[Row, ...]
    evaluations: tuple[Evaluation, ...]
    parts: tuple[FitPart, ...]
    wall_s: float

    def to_dict(self) -> dict:
        return {
            "fit": dataclasses.asdict(self.fit),
            "fitted_on": [
                {"case": p.case.name, "arm": p.arm, "max_rate": p.max_rate, "file": str(p.case.path)}
                for p in self.parts
            ],
            "residuals": [
                {
                    "arm": r.arm,
                    "stage": r.stage,
                    "metric": r.metric,
                    "published": r.published,
                    "simulated": r.simulated,
                    "ratio": r.ratio,
                }
                for r in self.rows
            ],
            "evaluations": [
                {
                    "step_overhead_s": e.fit.step_overhead_s,
                    "router_latency_s": e.fit.router_latency_s,
                    "cost": e.cost,
                    "wall_s": e.wall_s,
                }
                for e in self.evaluations
            ],
            "wall_s": self.wall_s,
        }


CLOSED_LOOP_FIT_METRICS = ("output_tok_s", "total_tok_s", "ttft_mean_s")


def fit_across(
    parts: Sequence[FitPart],
    max_evaluations: int = 8,
    seed: int = 0,
    start: Fit = START,
    on_evaluation: Callable[[Evaluation], None] | None = None,
) -> CasesFit:
    """One fit for one GPU type across several cases: the step overhead searched (bounded, 0-20 ms) and the
    router latency solved exactly (`best_router_latency`) on every part's fitted values at once; the efficiencies
    stay `start`'s, as on a GPU whose kernel tables price the steps (sim/kernel_cost.py) they move nothing.
    Each evaluation simulates every part (a staged part only its stages <= max_rate, after its warm-up)."""
    from scipy.optimize import minimize_scalar

    devices = {p.case.hardware for p in parts}
    if len(devices) != 1:
        raise ValueError(f"one fit per GPU type: the cases run on {', '.join(sorted(devices))}; fit each apart")
    started = time.perf_counter()
    fitted_on = "; ".join(
        f"{p.case.name}: {p.arm}" + (f" <= {p.max_rate:g}/s" if p.case.plan else " (whole run)") for p in parts
    )
    subsets, workloads = [], []
    for p in parts:
        if p.arm not in p.case.published:
            raise ValueError(f"{p.case.name} has no arm {p.arm!r}")
        subset = None
        if p.case.plan is not None:
            subset = [i for i, s in enumerate(p.case.plan.stages) if s.rate <= p.max_rate]
            if not subset:
                raise ValueError(f"no stage of {p.case.name} at <= {p.max_rate:g}/s to fit on")
        subsets.append(subset)
        workloads.append(case_workload(p.case, case_config(p.case, p.arm).geometry.vocab_size, seed))
    evaluations: list[Evaluation] = []

    def cost(overhead_ms: float) -> float:
        t = time.perf_counter()
        trial = Fit(start.flops_efficiency, start.bw_efficiency, overhead_ms / 1e3, 0.0, fitted_on)
        used: list[Row] = []
        for p, subset, workload in zip(parts, subsets, workloads):
            run = compare_arm(p.case, p.arm, trial, seed, stage_subset=subset, workload=workload)
            metrics = FIT_METRICS if subset is not None else CLOSED_LOOP_FIT_METRICS
            used += [
                dataclasses.replace(r, arm=f"{p.case.name}/{r.arm}")
                for r in run.rows
                if r.metric in metrics and r.ratio is not None
            ]
        latency = best_router_latency(used)
        rows = _with_router(used, latency)
        res = log_residuals(rows, FIT_METRICS + CLOSED_LOOP_FIT_METRICS)
        total = float(sum(r * r for r in res))
        keys = tuple(r.key for r in rows if r.ratio is not None)
        evaluation = Evaluation(
            dataclasses.replace(trial, router_latency_s=latency, fitted_rows=keys),
            tuple(rows),
            total,
            time.perf_counter() - t,
        )
        evaluations.append(evaluation)
        if on_evaluation is not None:
            on_evaluation(evaluation)
        return total

    minimize_scalar(cost, bounds=(0.0, 20.0), method="bounded", options={"maxiter": max_evaluations, "xatol": 0.25})
    best = min(evaluations, key=lambda e: e.cost)
    return CasesFit(best.fit, best.rows, tuple(evaluations), tuple(parts), time.perf_counter() - started)
