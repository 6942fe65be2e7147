"""Published GPU experiments as case files, replayed on the simulator and compared stage by stage.

A case file (YAML; `results/sim/published/*.yaml`) says where the experiment was published (`source`), what ran
(`hardware`: a device profile, devices per replica, replicas; `model`; `engine`: vLLM's block size, memory
utilization, batch limits, KV dtype), what was sent (`workload`: a kvbench workload parameter mapping, e.g.
`generator: shared_prefix` and its five parameters; `stages`: the warm-up and the ladder as RATE:SECONDS; `client`:
the load generator's cap on requests in flight, `max_concurrency`, when it had one, as `kvbench run
--max-concurrency`) and through which `routers` (presets.ROUTES), and what was measured: per router and stage
`published` `output_tok_s`, `ttft_mean_s`, `ttft_p90_s` (any may be absent), and optionally `whole_ladder` values
(`output_tok_s`, `ttft_mean_s`, `itl_mean_ms`).

`parse_case` is the one door for such a file (every field checked, a named failure otherwise); `case_config`
builds the simulated fleet (vLLM memory arithmetic, the engine's limits as the preset's); `compare` simulates
each router's ladder and lines up published and simulated values with their ratios (simulated / published);
`across_seeds` reduces several seeds' rows to one row per value, simulated = the median across seeds, with the
seeds' range beside it.
A fit (`Fit`: efficiencies, step overhead and router latency, written by `kvbench calibrate --published`) may
replace the profile's assumed values.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.measure.metrics import Summary, summarize_run
from kvbench.measure.stages import StagePlan, parse_stage, parse_stages
from kvbench.settings import read_yaml
from kvbench.sim.config import MEMORY_VLLM, SimConfig
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import Hardware, load_hardware
from kvbench.sim.presets import ROUTE_PRECISE_PREFIX, ROUTES, get_preset
from kvbench.sim.staged import StagedResult, simulate_stages
from kvbench.workloads.profiles import workload_from_mapping
from kvbench.workloads.spec import Workload

STAGE_METRICS = ("output_tok_s", "ttft_mean_s", "ttft_p90_s")
WHOLE_METRICS = ("output_tok_s", "ttft_mean_s", "itl_mean_ms")


class CaseError(ValueError):
    """A case file that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    source: Mapping[str, object]
    hardware: str
    devices_per_replica: int
    replicas: int
    model: str
    engine: Mapping[str, object]
    workload: Mapping[str, object]
    plan: StagePlan
    routers: tuple[str, ...]
    published: Mapping[str, Mapping[str, tuple[float | None, ...]]]  # router -> metric -> one value per stage
    whole_ladder: Mapping[str, Mapping[str, float]]
    path: Path
    fleet_scale: float = 1.0  # published replicas / simulated replicas (`subsample`); throughput scaled back by it
    max_concurrency: int | None = None  # the client's cap on requests in flight (None: none)


def subsample(case: Case, replicas: int) -> Case:
    """`case` on `replicas` of its replicas at replicas/N of every stage's rate (each replica's load kept), its
    simulated throughput to be scaled back by N/replicas, a client's cap on requests in flight cut to the same share.
    Sound for routers that spread requests evenly whatever the content (round-robin, least-loaded); a prefix-aware
    router would also need the content cut."""
    if not 1 <= replicas <= case.replicas:
        raise CaseError(f"--replicas {replicas}: give 1 to {case.replicas} (the case's replicas)")
    k = replicas / case.replicas
    scale = lambda stage: dataclasses.replace(stage, rate=stage.rate * k)  # noqa: E731
    plan = dataclasses.replace(case.plan, stages=tuple(scale(s) for s in case.plan.stages),
                               warmup=None if case.plan.warmup is None else scale(case.plan.warmup))
    cap = None if case.max_concurrency is None else max(int(round(case.max_concurrency * k)), 1)
    return dataclasses.replace(case, replicas=replicas, plan=plan, fleet_scale=case.replicas / replicas,
                               max_concurrency=cap)


@dataclass(frozen=True, slots=True)
class Fit:
    """Fitted values that replace a profile's assumed ones (`kvbench calibrate --published` writes them)."""

    flops_efficiency: float
    bw_efficiency: float
    step_overhead_s: float
    router_latency_s: float = 0.0
    fitted_on: str = ""
    fitted_rows: tuple[str, ...] = ()  # `Row.key` of every published value fitted on: the checks are the others

    def apply(self, hardware: Hardware) -> Hardware:
        device = dataclasses.replace(hardware.device, flops_efficiency=self.flops_efficiency,
                                     bw_efficiency=self.bw_efficiency)
        return dataclasses.replace(hardware, device=device, step_overhead_s=self.step_overhead_s,
                                   fitted_on=self.fitted_on or None)


def load_fit(path: Path) -> Fit:
    try:
        data = json.loads(Path(path).read_text())
        fields = {f.name for f in dataclasses.fields(Fit)}
        values = {k: v for k, v in data["fit"].items() if k in fields}
        return Fit(**values | {"fitted_rows": tuple(values.get("fitted_rows", ()))})
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CaseError(f"fit file {path}: {error}; write it with `kvbench calibrate --published CASE.yaml`") from None


def _need(doc: Mapping, key: str, kind: type | tuple, where: str):
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CaseError(f"{where}.{key} is {value!r}; give {getattr(kind, '__name__', kind)}")
    return value


def parse_case(path: Path) -> Case:
    """The case in `path`, every field checked (CaseError naming the field otherwise)."""
    doc = read_yaml(Path(path), "published case")
    where = Path(path).name
    if not isinstance(doc, dict):
        raise CaseError(f"{where}: expected a mapping (name, source, hardware, model, engine, workload, stages, ...)")
    hardware = _need(doc, "hardware", dict, where)
    engine = _need(doc, "engine", dict, where)
    workload = _need(doc, "workload", dict, where)
    stages = _need(doc, "stages", dict, where)
    try:
        warmup = parse_stage(str(stages["warmup"])) if stages.get("warmup") is not None else None
        plan = StagePlan(parse_stages(str(_need(stages, "ladder", str, f"{where}.stages"))), warmup)
    except ValueError as error:
        raise CaseError(f"{where}.stages: {error}") from None
    routers = tuple(doc.get("routers") or ())
    for route in routers:
        if route not in ROUTES:
            raise CaseError(f"{where}.routers: {route!r} is not one of {', '.join(ROUTES)}")
    published: dict[str, dict[str, tuple[float | None, ...]]] = {}
    for route, metrics in (doc.get("published") or {}).items():
        if route not in routers:
            raise CaseError(f"{where}.published.{route}: not one of routers {list(routers)}")
        published[route] = {}
        for metric, values in (metrics or {}).items():
            if metric not in STAGE_METRICS:
                raise CaseError(f"{where}.published.{route}.{metric}: use one of {', '.join(STAGE_METRICS)}")
            if not isinstance(values, list) or len(values) != len(plan.stages) or not all(
                    v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0) for v in values):
                raise CaseError(f"{where}.published.{route}.{metric}: give {len(plan.stages)} numbers > 0 (or null), "
                                "one per ladder stage")
            published[route][metric] = tuple(None if v is None else float(v) for v in values)
    whole: dict[str, dict[str, float]] = {}
    for route, metrics in (doc.get("whole_ladder") or {}).items():
        if route not in routers or not isinstance(metrics, dict) or set(metrics) - set(WHOLE_METRICS):
            raise CaseError(f"{where}.whole_ladder.{route}: a router of the case with {', '.join(WHOLE_METRICS)}")
        whole[route] = {k: float(v) for k, v in metrics.items()}
    for key in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
        _need(engine, key, int, f"{where}.engine")
    client = _need(doc, "client", dict, where) if doc.get("client") is not None else {}
    cap = client.get("max_concurrency")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise CaseError(f"{where}.client.max_concurrency is {cap!r}; give the requests in flight at most (>= 1), "
                        "or leave it out for no cap")
    utilization = _need(engine, "gpu_memory_utilization", (int, float), f"{where}.engine")
    if not 0 < utilization <= 1:
        raise CaseError(f"{where}.engine.gpu_memory_utilization is {utilization}; give a fraction in (0, 1]")
    return Case(str(doc.get("name", Path(path).stem)), dict(doc.get("source") or {}),
                str(_need(hardware, "profile", str, f"{where}.hardware")),
                _need(hardware, "devices_per_replica", int, f"{where}.hardware"),
                _need(hardware, "replicas", int, f"{where}.hardware"), str(_need(doc, "model", str, where)),
                dict(engine), dict(workload), plan, routers, published, whole, Path(path), max_concurrency=cap)


def case_config(case: Case, route: str, fit: Fit | None = None, hardware: Hardware | None = None) -> SimConfig:
    """The simulated fleet of `case` behind `route`: vLLM's memory arithmetic, the engine's limits, the fit."""
    hw = hardware or load_hardware(case.hardware).with_devices(case.devices_per_replica)
    hw = dataclasses.replace(hw, memory_fraction=float(case.engine["gpu_memory_utilization"]))
    if fit is not None:
        hw = fit.apply(hw)
    preset = dataclasses.replace(
        get_preset("vllm-prefix"), num_nodes=case.replicas, route=route, page_size=int(case.engine["block_size"]),
        max_num_seqs=int(case.engine["max_num_seqs"]), max_step_tokens=int(case.engine["max_num_batched_tokens"]),
        router_latency_s=fit.router_latency_s if fit is not None and route == ROUTE_PRECISE_PREFIX else 0.0)
    return SimConfig(load_geometry(case.model), hw, preset, str(case.engine.get("kv_dtype", "bf16")),
                     memory_model=MEMORY_VLLM)


def case_workload(case: Case, geometry_vocab: int, seed: int = 0) -> Workload:
    """The case's workload, with as many requests as its stages send."""
    return workload_from_mapping(case.workload, case.name, seed=seed, num_sessions=case.plan.total_requests,
                                 vocab_size=min(geometry_vocab, 32000), where=f"{case.path.name}.workload")


@dataclass(frozen=True, slots=True)
class Row:
    """One value, published beside simulated (None: not published / not measured)."""

    route: str
    stage: str  # the stage's rate, or "whole"
    metric: str
    published: float | None
    simulated: float | None

    @property
    def key(self) -> str:
        """`route/stage/metric`: which published value this is (a fit lists the ones it was made on)."""
        return f"{self.route}/{self.stage}/{self.metric}"

    @property
    def ratio(self) -> float | None:
        if self.published is None or self.simulated is None:
            return None
        return self.simulated / self.published


def stage_values(summary: Summary, fleet_scale: float = 1.0) -> dict[str, float | None]:
    """The compared metrics of one stage's (or the whole ladder's) summary, in the case file's units (a
    subsampled fleet's throughput scaled back to the whole fleet)."""
    return {"output_tok_s": None if summary.output_tok_s is None else summary.output_tok_s * fleet_scale,
            "ttft_mean_s": summary.ttft_ms.mean / 1e3 if summary.ttft_ms else None,
            "ttft_p90_s": summary.ttft_ms.p90 / 1e3 if summary.ttft_ms else None,
            "itl_mean_ms": summary.itl_ms.mean if summary.itl_ms else None}


@dataclass(frozen=True, slots=True)
class RouteRun:
    route: str
    staged: StagedResult
    rows: tuple[Row, ...]


def compare_route(case: Case, route: str, fit: Fit | None = None, seed: int = 0,
                  stage_subset: Sequence[int] | None = None, workload: Workload | None = None) -> RouteRun:
    """Simulate `route`'s ladder (or the stages `stage_subset`) and line it up with the published values."""
    config = case_config(case, route, fit)
    workload = workload or case_workload(case, config.geometry.vocab_size, seed)
    staged = simulate_stages(workload, case.plan, config, run_id=f"{case.name}/{route}", seed=seed,
                             stage_subset=stage_subset, max_concurrency=case.max_concurrency)
    indices = list(range(len(case.plan.stages))) if stage_subset is None else sorted(stage_subset)
    published = case.published.get(route, {})
    rows = []
    for position, summary in zip(indices, staged.stage_summaries()):
        values = stage_values(summary, case.fleet_scale)
        for metric in STAGE_METRICS:
            rows.append(Row(route, f"{case.plan.stages[position].rate * case.fleet_scale:g}", metric,
                            published.get(metric, (None,) * len(case.plan.stages))[position], values[metric]))
    if stage_subset is None:
        whole = stage_values(summarize_run([r for stage in staged.stage_records for r in stage]).overall,
                             case.fleet_scale)
        for metric in WHOLE_METRICS:
            rows.append(Row(route, "whole", metric, case.whole_ladder.get(route, {}).get(metric), whole[metric]))
    return RouteRun(route, staged, tuple(rows))


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
        spreads.append(SeedSpread(dataclasses.replace(first, simulated=median),
                                  min(measured, default=None), max(measured, default=None), values))
    return tuple(spreads)


def first_rate_above(rows: Sequence[Row], route: str, metric: str, limit: float, simulated: bool) -> float | None:
    """The first stage rate whose `metric` exceeds `limit` (the simulated or the published value)."""
    for row in rows:
        if row.route == route and row.metric == metric and row.stage != "whole":
            value = row.simulated if simulated else row.published
            if value is not None and value > limit:
                return float(row.stage)
    return None


def log_residuals(rows: Sequence[Row], metrics: Sequence[str]) -> list[float]:
    """log(simulated / published) of every row of `metrics` with both values (a fit's residuals)."""
    return [math.log(r.ratio) for r in rows if r.metric in metrics and r.ratio is not None and r.ratio > 0]
