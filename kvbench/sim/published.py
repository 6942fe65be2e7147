"""Published GPU experiments (case files, `published_case.py`) replayed on the simulator and compared arm by arm.

`case_config` builds one arm's simulated fleet (vLLM memory arithmetic, the engine's limits, the arm's router
with its scorers, its KV tier and P/D split); `compare_arm` simulates the arm's load (Poisson stages, or a
closed loop) and lines up published and simulated values with their ratios (simulated / published), per stage
and for the whole run; `effect_rows` compares the published changes between arms (`effects:`) with the
simulated ones; `comparison_doc` is comparison.json's `arms` / `stages` / `effects` part. `across_seeds`
reduces several seeds' rows to one row per value, simulated = the median across seeds, with the seeds' range
beside it.
A fit (`Fit`: efficiencies, step overhead and router latency, written by `kvbench calibrate --published`) may
replace the profile's assumed values.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.measure.metrics import summarize_run
from kvbench.measure.records import RequestRecord
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.config import MEMORY_VLLM, SimConfig
from kvbench.sim.engine import SimResult, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import Hardware, load_hardware
from kvbench.sim.kv_offload import Medium
from kvbench.sim.presets import ROUTE_PRECISE_PREFIX, ROUTE_PREFIX_AFFINITY, SCORERS, Scorers, get_preset
from kvbench.sim.published_case import (  # noqa: F401  (the case's names, re-exported for callers)
    METRICS,
    STAGE_METRICS,
    WHOLE,
    WHOLE_LADDER_METRICS,
    Arm,
    Case,
    CaseError,
    effect_value,
    parse_case,
    subsample,
)
from kvbench.sim.staged import simulate_stages
from kvbench.workloads.profiles import workload_from_mapping
from kvbench.workloads.spec import Workload, WorkloadError

THROUGHPUTS = ("output_tok_s", "total_tok_s", "request_s")  # scaled back by a subsampled fleet's scale


@dataclass(frozen=True, slots=True)
class Fit:
    """Fitted values that replace a profile's assumed ones (`kvbench calibrate --published` writes them)."""

    flops_efficiency: float
    bw_efficiency: float
    step_overhead_s: float
    router_latency_s: float = 0.0
    fitted_on: str = ""
    fitted_rows: tuple[str, ...] = ()  # `Row.key` of every published value fitted on: the checks are the others

    def rows_of(self, case_name: str) -> tuple[str, ...]:
        """The `Row.key`s fitted on in case `case_name` (a fit across cases names each as `CASE/ARM/...`)."""
        prefix = f"{case_name}/"
        return tuple(k.removeprefix(prefix) for k in self.fitted_rows if k.startswith(prefix) or k.count("/") == 2)

    def apply(self, hardware: Hardware) -> Hardware:
        device = dataclasses.replace(
            hardware.device, flops_efficiency=self.flops_efficiency, bw_efficiency=self.bw_efficiency
        )
        return dataclasses.replace(
            hardware, device=device, step_overhead_s=self.step_overhead_s, fitted_on=self.fitted_on or None
        )


def load_fit(path: Path) -> Fit:
    try:
        data = json.loads(Path(path).read_text())
        fields = {f.name for f in dataclasses.fields(Fit)}
        values = {k: v for k, v in data["fit"].items() if k in fields}
        return Fit(**values | {"fitted_rows": tuple(values.get("fitted_rows", ()))})
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CaseError(f"fit file {path}: {error}; write it with `kvbench calibrate --published CASE.yaml`") from None


def cpu_tier_blocks(config: SimConfig) -> int | None:
    """Blocks of the config's CPU tier per replica (None: no CPU tier): the CPU-prefix scorer's default index."""
    spec = config.kv_offload
    cpu = next((t for t in spec.tiers if t.medium == Medium.CPU), None) if spec is not None else None
    return None if cpu is None else max(config.tier_pages(cpu.bytes_per_replica), 1)


EPP_ROUTES = (ROUTE_PRECISE_PREFIX, ROUTE_PREFIX_AFFINITY)  # llm-d's endpoint picker: the fit's router latency


def case_config(case: Case, arm: str, fit: Fit | None = None, hardware: Hardware | None = None) -> SimConfig:
    """The simulated fleet of `case`'s `arm`: vLLM's memory arithmetic, the arm's engine limits, router and KV
    tiers, the fit."""
    spec = case.arm(arm)
    engine = spec.engine
    hw = hardware or load_hardware(case.hardware).with_devices(case.devices_per_replica)
    hw = dataclasses.replace(hw, memory_fraction=float(engine.gpu_memory_utilization))
    if fit is not None:
        hw = fit.apply(hw)
    route = spec.router.name
    preset = dataclasses.replace(
        get_preset("vllm-prefix"),
        num_nodes=case.replicas,
        route=route,
        page_size=engine.block_size,
        max_num_seqs=engine.max_num_seqs,
        max_step_tokens=engine.max_num_batched_tokens,
        router_latency_s=fit.router_latency_s if fit is not None and route in EPP_ROUTES else 0.0,
    )
    config = SimConfig(
        load_geometry(case.model),
        hw,
        preset,
        engine.kv_dtype.lower(),
        memory_model=MEMORY_VLLM,
        kv_offload=spec.kv_offload,
        pd=spec.pd,
    )
    if spec.router.affinity is not None:
        config = dataclasses.replace(config, preset=dataclasses.replace(preset, affinity=spec.router.affinity))
    if spec.router.weights is not None or spec.router.cpu_lru_blocks is not None:
        blocks = spec.router.cpu_lru_blocks or cpu_tier_blocks(config)
        weights = {name: 0.0 for name in SCORERS} | dict(spec.router.weights) if spec.router.weights else {}
        if weights.get("cpu_prefix", 0) > 0 and blocks is None:
            raise CaseError(
                f"{case.path.name}.arms.{arm}.router: a cpu_prefix weight needs cpu_lru_blocks (the "
                "scorer's lruCapacityPerServer) or a cpu tier in engine.kv_offload to size it from"
            )
        config = dataclasses.replace(
            config, preset=dataclasses.replace(preset, scorers=Scorers(**weights, cpu_lru_blocks=blocks))
        )
    return config


def case_workload(case: Case, geometry_vocab: int, seed: int = 0) -> Workload:
    """The case's workload, with as many requests as its load sends."""
    try:
        return workload_from_mapping(
            case.workload,
            case.name,
            seed=seed,
            num_sessions=case.total_requests,
            vocab_size=min(geometry_vocab, 32000),
            where=f"{case.path.name}.workload",
        )
    except WorkloadError as error:
        raise CaseError(str(error)) from None


@dataclass(frozen=True, slots=True)
class Row:
    """One value, published beside simulated (None: not published / not measured)."""

    arm: str
    stage: str  # the stage's rate, or WHOLE
    metric: str
    published: float | None
    simulated: float | None

    @property
    def key(self) -> str:
        """`arm/stage/metric`: which published value this is (a fit lists the ones it was made on)."""
        return f"{self.arm}/{self.stage}/{self.metric}"

    @property
    def ratio(self) -> float | None:
        if self.published is None or self.simulated is None or self.published == 0:
            return None
        return self.simulated / self.published


def measured(records: Sequence[RequestRecord], fleet_scale: float = 1.0) -> dict[str, float | None]:
    """Every metric of METRICS over `records` (warm-up ones left out), in the case file's units (a subsampled
    fleet's throughput scaled back to the whole fleet). Hit rates: device-hit tokens over prompt tokens
    (vLLM's prefix cache hit rate), and tokens restored from a CPU tier over the prompt tokens the device
    lacked (vLLM's external, connector hit rate)."""
    s = summarize_run(list(records)).overall

    def ms(d, stat):
        return None if d is None else getattr(d, stat) / 1e3

    done = [r for r in records if r.ok and not r.warmup]
    prompt = sum(r.prompt_tokens or 0 for r in done)
    device = sum((r.cached_tokens_by_tier or {}).get("device", 0) for r in done)
    host = sum((r.cached_tokens_by_tier or {}).get("host", 0) for r in done)
    values = {
        "output_tok_s": s.output_tok_s,
        "total_tok_s": s.total_tok_s,
        "request_s": s.req_s,
        "ttft_mean_s": ms(s.ttft_ms, "mean"),
        "ttft_p50_s": ms(s.ttft_ms, "p50"),
        "ttft_p90_s": ms(s.ttft_ms, "p90"),
        "ttft_p95_s": ms(s.ttft_ms, "p95"),
        "ttft_p99_s": ms(s.ttft_ms, "p99"),
        "e2e_mean_s": ms(s.e2e_ms, "mean"),
        "e2e_p50_s": ms(s.e2e_ms, "p50"),
        "e2e_p90_s": ms(s.e2e_ms, "p90"),
        "itl_mean_ms": s.itl_ms.mean if s.itl_ms else None,
        "gpu_hit_rate": device / prompt if prompt else None,
        "cpu_hit_rate": host / (prompt - device) if prompt > device else None,
    }
    for key in THROUGHPUTS:
        if values[key] is not None:
            values[key] *= fleet_scale
    return values


@dataclass(frozen=True, slots=True)
class ArmRun:
    arm: str
    result: SimResult
    stage_records: tuple[tuple[RequestRecord, ...], ...]  # per measured stage (none for a closed loop)
    rows: tuple[Row, ...]


def compare_arm(
    case: Case,
    arm: str,
    fit: Fit | None = None,
    seed: int = 0,
    stage_subset: Sequence[int] | None = None,
    workload: Workload | None = None,
) -> ArmRun:
    """Simulate `arm`'s load (or the stages `stage_subset`) and line it up with the published values."""
    config = case_config(case, arm, fit)
    workload = workload or case_workload(case, config.geometry.vocab_size, seed)
    published = case.published[arm]
    wanted = {m for a in case.published.values() for m in a.stages}
    stage_metrics = [m for m in METRICS if m in STAGE_METRICS or m in wanted]
    whole_metrics = [
        m for m in METRICS if m in WHOLE_LADDER_METRICS or any(m in a.whole for a in case.published.values())
    ]
    rows: list[Row] = []
    if case.plan is None:
        loop = case.closed_loop
        load = LoadSpec(
            concurrency=loop.concurrency, num_requests=loop.num_requests, warmup_requests=loop.warmup_requests
        )
        result = simulate(workload, load, config, run_id=f"{case.name}/{arm}", seed=seed)
        stage_records: tuple = ()
        records = result.records
    else:
        staged = simulate_stages(
            workload,
            case.plan,
            config,
            run_id=f"{case.name}/{arm}",
            seed=seed,
            stage_subset=stage_subset,
            max_concurrency=case.max_concurrency,
        )
        result, stage_records = staged.result, staged.stage_records
        indices = list(range(len(case.plan.stages))) if stage_subset is None else sorted(stage_subset)
        for position, records in zip(indices, stage_records):
            values = measured(records, case.fleet_scale)
            for metric in stage_metrics:
                given = published.stages.get(metric)
                rows.append(
                    Row(
                        arm,
                        case.stage_labels[position],
                        metric,
                        None if given is None else given[position],
                        values[metric],
                    )
                )
        records = [r for stage in stage_records for r in stage]
    if stage_subset is None:
        values = measured(records, case.fleet_scale)
        rows += [Row(arm, WHOLE, m, published.whole.get(m), values[m]) for m in whole_metrics]
    return ArmRun(arm, result, tuple(stage_records), tuple(rows))


@dataclass(frozen=True, slots=True)
class EffectRow:
    """A published change between two arms beside the simulated one (`arm` / `over` - 1; None: not measured)."""

    arm: str
    over: str
    metric: str
    stage: str  # WHOLE or a stage's label
    published_change: float
    simulated_change: float | None

    @property
    def same_direction(self) -> bool | None:
        if self.simulated_change is None:
            return None
        return (self.simulated_change > 0) == (self.published_change > 0)

    @property
    def size_ratio(self) -> float | None:
        """The simulated change over the published one (1: the same size)."""
        if self.simulated_change is None or self.published_change == 0:
            return None
        return self.simulated_change / self.published_change


def effect_rows(case: Case, rows: Sequence[Row]) -> list[EffectRow]:
    """The case's effects on `rows` of its arms (the whole-run rows, or a stage's)."""
    by = {(r.arm, r.stage, r.metric): r for r in rows}
    out = []
    for e in case.effects:
        a, b = by.get((e.arm, e.stage, e.metric)), by.get((e.over, e.stage, e.metric))
        mine = effect_value(case.published[e.arm], e, case.stage_labels)
        theirs = effect_value(case.published[e.over], e, case.stage_labels)
        pub = mine / theirs - 1 if theirs else math.nan
        sim = None if a is None or b is None or not a.simulated or not b.simulated else a.simulated / b.simulated - 1
        out.append(EffectRow(e.arm, e.over, e.metric, e.stage, pub, sim))
    return out


def comparison_doc(rows: Sequence[Row], effects: Sequence[EffectRow]) -> dict:
    """comparison.json's `arms` (whole-run values), `stages` (per stage, beside them) and `effects`."""

    def cell(r):
        return {"published": r.published, "simulated": r.simulated, "ratio": r.ratio}

    arms: dict = {}
    stages: dict = {}
    for r in rows:
        if r.stage == WHOLE:
            arms.setdefault(r.arm, {})[r.metric] = cell(r)
        else:
            stages.setdefault(r.arm, {}).setdefault(r.stage, {})[r.metric] = cell(r)
    return {
        "arms": arms,
        "stages": stages,
        "effects": [
            {
                "arm": e.arm,
                "over": e.over,
                "metric": e.metric,
                "published_change": e.published_change,
                "simulated_change": e.simulated_change,
                **({} if e.stage == WHOLE else {"stage": e.stage}),
            }
            for e in effects
        ],
    }


@dataclass(frozen=True, slots=True)
class SeedSpread:
    """One published value against several seeds' simulations: `row.simulated` is the median across the seeds that
    measured it (None: none did), `low`/`high` their range, `per_seed` each seed's value (None: not measured)."""

    row: Row
    low: float | None
    high: float | None
    per_seed: tuple[float | None, ...]


def across_seeds(per_seed: Sequence[Sequence[Row]]) -> tuple[SeedSpread, ...]:
    """The rows of several seeds' runs of the same case (one sequence per seed, in seed order) as one `SeedSpread`
    per `Row.key`, in the first seed's order. The median is numpy's (the middle value, or the mean of the two
    middle ones for an even count)."""
    by_seed = [{r.key: r for r in rows} for rows in per_seed]
    keys = dict.fromkeys(r.key for rows in per_seed for r in rows)
    spreads = []
    for key in keys:
        first = next(seed[key] for seed in by_seed if key in seed)
        values = tuple(seed[key].simulated if key in seed else None for seed in by_seed)
        measured = [v for v in values if v is not None]
        median = float(np.median(measured)) if measured else None
        spreads.append(
            SeedSpread(
                dataclasses.replace(first, simulated=median),
                min(measured, default=None),
                max(measured, default=None),
                values,
            )
        )
    return tuple(spreads)


def first_rate_above(rows: Sequence[Row], arm: str, metric: str, limit: float, simulated: bool) -> float | None:
    """The first stage rate whose `metric` exceeds `limit` (the simulated or the published value)."""
    for row in rows:
        if row.arm == arm and row.metric == metric and row.stage != WHOLE:
            value = row.simulated if simulated else row.published
            if value is not None and value > limit:
                return float(row.stage)
    return None


def log_residuals(rows: Sequence[Row], metrics: Sequence[str]) -> list[float]:
    """log(simulated / published) of every row of `metrics` with both values (a fit's residuals)."""
    return [math.log(r.ratio) for r in rows if r.metric in metrics and r.ratio is not None and r.ratio > 0]
