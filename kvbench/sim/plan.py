"""Cluster planning: the fewest simulated nodes that meet every SLO, per preset and KV dtype.

`parse_slo` reads `ttft_p99_ms=500,tpot_p50_ms=50` into targets (metric, statistic, limit in ms), each read
from the run summary's `Distribution` of that metric. `search_nodes` finds the smallest node count that meets
them, given a function that evaluates one node count: doubling from 1 until a count meets them (or
`max_nodes` is reached), then bisecting between the last count that failed and the first that met. That
assumes more nodes never make an SLO worse (monotonicity); it is checked, not trusted: the count above the
answer is evaluated too, and any tried count whose verdict or metric goes against the trend is reported in
`NodeSearch.non_monotone`. `plan_point` evaluates one node count with the multi-node simulator, routing
requests by the preset's policy (presets.ROUTES), and states its cost: the simulated serving time and the
node-hours and device-hours it took.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvbench.measure.metrics import Summary, summarize_run
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.workloads.spec import Workload

SLO_METRICS = ("ttft", "tpot", "itl", "e2e", "queue_wait")  # Summary fields `<metric>_ms`
SLO_STATS = ("mean", "p50", "p90", "p95", "p99", "max")  # Distribution fields
SLO_EXAMPLE = "ttft_p99_ms=500,tpot_p50_ms=50"


@dataclass(frozen=True, slots=True)
class SloTarget:
    """`<metric>_<stat>_ms <= limit_ms` over a run's completed requests."""

    metric: str
    stat: str
    limit_ms: float

    @property
    def name(self) -> str:
        return f"{self.metric}_{self.stat}_ms"

    def value(self, summary: Summary) -> float | None:
        """The run's value of this metric, or None when it has none (no completed request, no decode)."""
        distribution = getattr(summary, f"{self.metric}_ms")
        return None if distribution is None else float(getattr(distribution, self.stat))


def parse_slo(text: str) -> tuple[SloTarget, ...]:
    """`ttft_p99_ms=500,tpot_p50_ms=50` -> targets; ValueError naming the part that cannot be read."""
    targets: list[SloTarget] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        pieces = key.strip().split("_")
        metric, stat = "_".join(pieces[:-2]), pieces[-2] if len(pieces) >= 3 else ""
        if not sep or len(pieces) < 3 or pieces[-1] != "ms":
            raise ValueError(f"{part!r} is not METRIC_STAT_ms=LIMIT; write e.g. {SLO_EXAMPLE}")
        if metric not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {metric!r} in {part!r}; use one of {', '.join(SLO_METRICS)}")
        if stat not in SLO_STATS:
            raise ValueError(f"unknown statistic {stat!r} in {part!r}; use one of {', '.join(SLO_STATS)}")
        try:
            limit = float(value)
        except ValueError:
            limit = math.nan
        if not (limit > 0 and math.isfinite(limit)):
            raise ValueError(f"{part!r}: the limit must be a number of ms > 0, e.g. {SLO_EXAMPLE}")
        if any(t.name == f"{metric}_{stat}_ms" for t in targets):
            raise ValueError(f"{metric}_{stat}_ms is given twice; give each target once")
        targets.append(SloTarget(metric, stat, limit))
    if not targets:
        raise ValueError(f"no SLO given; write e.g. {SLO_EXAMPLE}")
    return tuple(targets)


@dataclass(frozen=True, slots=True)
class PlanPoint:
    """One node count simulated: its SLO values, verdict and cost."""

    nodes: int
    values: Mapping[str, float | None]  # SloTarget.name -> the run's value (None: missing)
    meets: bool  # every target met, and every request completed
    requests: int
    errors: int
    output_tok_s: float | None
    virtual_s: float  # simulated serving time: first arrival to last completion
    node_hours: float  # nodes x virtual_s
    device_hours: float  # node_hours x devices per node
    wall_s: float  # what the simulation took here

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "values": dict(self.values)}


def meets_all(targets: Sequence[SloTarget], values: Mapping[str, float | None], errors: int) -> bool:
    """Every target's value is present and within its limit, and no request failed."""
    return errors == 0 and all(values.get(t.name) is not None and values[t.name] <= t.limit_ms for t in targets)


def plan_point(
    workload: Workload, load: LoadSpec, config: SimConfig, nodes: int, targets: Sequence[SloTarget], seed: int = 0
) -> PlanPoint:
    """Simulate `config` on `nodes` nodes (its preset's routing) and judge the SLO targets."""
    preset = dataclasses.replace(config.preset, num_nodes=nodes)
    result = simulate(
        workload,
        load,
        dataclasses.replace(config, preset=preset),
        seed=seed,
        run_id=f"plan:{preset.name}/{config.kv_dtype}/{nodes}",
    )
    summary = summarize_run(result.records).overall
    values = {t.name: t.value(summary) for t in targets}
    errors = summary.requests - summary.completed  # failed or never finished
    hours = nodes * result.virtual_s / 3600
    return PlanPoint(
        nodes,
        values,
        meets_all(targets, values, errors),
        summary.requests,
        errors,
        summary.output_tok_s,
        result.virtual_s,
        hours,
        hours * config.hardware.num_devices,
        result.wall_s,
    )


@dataclass(frozen=True, slots=True)
class NodeSearch:
    answer: int | None  # the fewest nodes that met every target; None: not even max_nodes did
    points: tuple[PlanPoint, ...]  # every count tried, by node count
    non_monotone: tuple[str, ...]  # findings against "more nodes never hurt"
    unreachable: str | None = None  # a target below its floor at unbounded nodes (`plan_floor`): not searched
    floors: Mapping[str, float] = dataclasses.field(default_factory=dict)  # SloTarget.name -> floor in ms


def search_nodes(
    evaluate: Callable[[int], PlanPoint],
    max_nodes: int,
    targets: Sequence[SloTarget] = (),
    on_point: Callable[[PlanPoint], None] | None = None,
) -> NodeSearch:
    """The smallest n in [1, max_nodes] with `evaluate(n).meets`, by doubling then bisection (module doc).

    `on_point` sees each point as it is evaluated (to write results as the search goes)."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes={max_nodes}: must be >= 1")
    tried: dict[int, PlanPoint] = {}

    def point(n: int) -> PlanPoint:
        if n not in tried:
            tried[n] = evaluate(n)
            if on_point is not None:
                on_point(tried[n])
        return tried[n]

    failed, n = 0, 1
    while not point(n).meets:
        failed = n
        if n == max_nodes:
            return NodeSearch(None, _sorted(tried), _non_monotone(tried, targets))
        n = min(2 * n, max_nodes)
    met = n
    while met - failed > 1:
        mid = (failed + met) // 2
        if point(mid).meets:
            met = mid
        else:
            failed = mid
    if met < max_nodes:
        point(met + 1)  # the monotonicity check: one more node must meet the targets too
    return NodeSearch(met, _sorted(tried), _non_monotone(tried, targets))


def _sorted(tried: Mapping[int, PlanPoint]) -> tuple[PlanPoint, ...]:
    return tuple(tried[n] for n in sorted(tried))


def _non_monotone(tried: Mapping[int, PlanPoint], targets: Sequence[SloTarget]) -> tuple[str, ...]:
    """Pairs of tried counts where more nodes did worse: a verdict that flips back, or a metric that rose."""
    points = _sorted(tried)
    findings = []
    for fewer, more in zip(points, points[1:]):
        if fewer.meets and not more.meets:
            findings.append(f"{fewer.nodes} nodes meet the SLO but {more.nodes} do not")
        for t in targets:
            a, b = fewer.values.get(t.name), more.values.get(t.name)
            if a is not None and b is not None and b > a * 1.05 and b > t.limit_ms * 0.05:
                findings.append(f"{t.name} rose from {a:,.0f} at {fewer.nodes} nodes to {b:,.0f} at {more.nodes}")
    return tuple(findings)
