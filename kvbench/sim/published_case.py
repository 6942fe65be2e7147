"""A published GPU experiment's case file (YAML, `results/sim/published/*.yaml`), parsed once into a `Case`.

The format (results/sim/published/README.md documents it with examples; version 1 files load unchanged):

    name, source          the experiment and where it was published (source: a mapping of strings)
    hardware              {profile, devices_per_replica, replicas}: a device profile (sim/hardware)
    model                 a geometry (sim/models/*.json)
    engine                {name, block_size, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens,
                          kv_dtype, kv_offload, pd}: vLLM's settings; kv_offload and pd as sim/kv_offload.py
                          spells them
    workload              a kvbench workload parameter mapping (`generator: shared_prefix` and its parameters)
    stages                {warmup, ladder, gap_s}: Poisson stages as RATE:SECONDS, each drained before the next
                          and the next started gap_s later (1 s unless given)
      or load             {closed_loop: {concurrency, num_requests, warmup_requests}}: a fixed concurrency
                          (inference-perf `type: concurrent`), or {stages: {...}} as above
    client                {max_concurrency}: the load generator's cap on requests in flight
    arms                  {ARM: {router, engine}}: what differs between the compared runs (`published_arms.py`:
                          the router and its parameters; `engine` fields replacing the case's, a KV tier, say)
      or routers          [ROUTER, ...]: version 1, one arm per router, named after it
    published             {ARM: {METRIC: value}}: a number is the whole run's value, a list one per stage
                          (null where not published); METRIC one of METRICS
    whole_ladder          {ARM: {METRIC: value}}: version 1's whole-run values
    effects               [{arm, over, metric, stage}]: published changes that are themselves targets (arm / over
                          - 1), of the whole-run values, or with `stage: RATE` of that stage's

`parse_case` is the one door: every field is read here, and a value of the wrong kind or range anywhere is a
`CaseError` naming the field and the fix, never a traceback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvbench.measure.stages import STAGE_GAP_S, StagePlan, parse_stage, parse_stages
from kvbench.settings import SettingsError, bounded, read_yaml
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.published_arms import (  # noqa: F401  (the arms' names, re-exported for callers)
    Arm,
    CaseError,
    EngineSpec,
    RouterSpec,
    arms_of,
    built_doc,
    finite_number,
    mapping_of,
    parse_engine,
    require_fields,
)
from kvbench.workloads.shared_prefix import SharedPrefixParams

# What a case may publish, per arm (whole run) or per stage. Throughput in tokens/s (total: input + output),
# request_s in completed requests/s, TTFT and E2E in seconds, ITL in ms, hit rates as fractions of tokens.
METRICS = (
    "output_tok_s",
    "total_tok_s",
    "request_s",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "e2e_mean_s",
    "e2e_p50_s",
    "e2e_p90_s",
    "itl_mean_ms",
    "gpu_hit_rate",
    "cpu_hit_rate",
)
STAGE_METRICS = ("output_tok_s", "ttft_mean_s", "ttft_p90_s")  # the per-stage table's columns
WHOLE_LADDER_METRICS = ("output_tok_s", "ttft_mean_s", "itl_mean_ms")  # version 1's `whole_ladder` keys
WHOLE = "whole"  # the stage label of whole-run values


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """A fixed number of requests in flight (inference-perf `type: concurrent`): `num_requests` sent, the first
    `warmup_requests` of them left out of the metrics."""

    concurrency: int = bounded(None, ge=1)
    num_requests: int = bounded(None, ge=1)
    warmup_requests: int = bounded(0, ge=0)


@dataclass(frozen=True, slots=True)
class ArmPublished:
    """One arm's published values: whole-run and per stage (one value per stage, None where not published)."""

    whole: Mapping[str, float]
    stages: Mapping[str, tuple[float | None, ...]]


@dataclass(frozen=True, slots=True)
class Effect:
    """A published change that is a target of its own: `metric` of `arm` over that of `over`, minus 1, in the
    whole run (`stage` WHOLE) or in one stage (its label)."""

    arm: str
    over: str
    metric: str
    stage: str = WHOLE


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    source: Mapping[str, object]
    hardware: str
    devices_per_replica: int
    replicas: int
    model: str
    engine: EngineSpec
    workload: Mapping[str, object]
    plan: StagePlan | None  # Poisson stages, or None for a closed loop
    arms: tuple[Arm, ...]
    published: Mapping[str, ArmPublished]
    path: Path
    closed_loop: ClosedLoop | None = None
    effects: tuple[Effect, ...] = ()
    fleet_scale: float = 1.0  # published replicas / simulated replicas (`subsample`); throughput scaled back by it
    max_concurrency: int | None = None  # the client's cap on requests in flight (None: none)

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(arm.name for arm in self.arms)

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise CaseError(f"{self.path.name}: no arm {name!r}; its arms: {', '.join(self.arm_names)}")

    @property
    def total_requests(self) -> int:
        if self.plan is not None:
            return self.plan.total_requests
        return self.closed_loop.num_requests

    @property
    def stage_labels(self) -> tuple[str, ...]:
        """Each stage's label (its rate, for the whole fleet); none for a closed loop."""
        if self.plan is None:
            return ()
        return tuple(f"{s.rate * self.fleet_scale:g}" for s in self.plan.stages)


@dataclass(frozen=True)
class _HardwareDoc:
    profile: str | None = None
    devices_per_replica: int | None = bounded(None, ge=1)
    replicas: int | None = bounded(None, ge=1)


@dataclass(frozen=True)
class _ClientDoc:
    max_concurrency: int | None = bounded(None, ge=1)


def _text(doc: Mapping, key: str, where: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str) or not value:
        raise CaseError(f"{where}.{key} is {value!r:.60}; give a name (text)")
    return value


def _load(doc: Mapping, where: str) -> tuple[StagePlan | None, ClosedLoop | None]:
    load = mapping_of(doc, "load", where, required=False)
    unknown = set(load) - {"closed_loop", "stages"}
    if unknown:
        raise CaseError(f"{where}.load: unknown {sorted(unknown)}; give closed_loop or stages")
    stages = load.get("stages", doc.get("stages"))
    if ("stages" in load and doc.get("stages") is not None) or (stages is not None and "closed_loop" in load):
        raise CaseError(f"{where}: give one load: stages or load.closed_loop")
    if "closed_loop" in load:
        loop = built_doc(ClosedLoop, load["closed_loop"], f"{where}.load.closed_loop")
        require_fields(loop, ("concurrency", "num_requests"), f"{where}.load.closed_loop")
        if loop.warmup_requests >= loop.num_requests:
            raise CaseError(f"{where}.load.closed_loop.warmup_requests: give fewer than num_requests")
        return None, loop
    if not isinstance(stages, Mapping):
        raise CaseError(
            f'{where}.stages is {stages!r:.60}; give {{warmup: "RATE:S", ladder: "RATE:S,..."}} or '
            "load: {closed_loop: {concurrency: C, num_requests: N}}"
        )
    warmup, ladder, gap = stages.get("warmup"), stages.get("ladder"), stages.get("gap_s", STAGE_GAP_S)
    if not isinstance(ladder, str) or not (warmup is None or isinstance(warmup, str)):
        raise CaseError(f"{where}.stages: give ladder (and warmup) as text, RATE:SECONDS[,RATE:SECONDS...]")
    if set(stages) - {"warmup", "ladder", "gap_s"}:
        raise CaseError(
            f"{where}.stages: unknown {sorted(set(stages) - {'warmup', 'ladder', 'gap_s'})}; give warmup, ladder, gap_s"
        )
    gap = finite_number(gap, f"{where}.stages.gap_s")
    try:
        return StagePlan(parse_stages(ladder), parse_stage(warmup) if warmup is not None else None, gap), None
    except ValueError as error:
        raise CaseError(f"{where}.stages: {error}") from None


def _published(doc: Mapping, arms: tuple[str, ...], stages: int, where: str) -> dict[str, ArmPublished]:
    whole: dict[str, dict[str, float]] = {arm: {} for arm in arms}
    per_stage: dict[str, dict[str, tuple[float | None, ...]]] = {arm: {} for arm in arms}
    for section in ("published", "whole_ladder"):
        for arm, metrics in mapping_of(doc, section, where, required=False).items():
            at = f"{where}.{section}.{arm}"
            if arm not in arms:
                raise CaseError(f"{at}: not one of the arms {list(arms)}")
            if not isinstance(metrics, Mapping):
                raise CaseError(f"{at} is {metrics!r:.60}; give a mapping of metrics ({', '.join(METRICS)})")
            for metric, value in metrics.items():
                if metric not in METRICS:
                    raise CaseError(f"{at}.{metric}: use one of {', '.join(METRICS)}")
                if isinstance(value, list) and section == "published":
                    if len(value) != stages or not all(
                        v is None or finite_number(v, f"{at}.{metric}") > 0 for v in value
                    ):
                        raise CaseError(
                            f"{at}.{metric}: give {stages} numbers > 0 (or null), one per ladder stage"
                            if stages
                            else f"{at}.{metric}: a closed loop has no stages; give one number"
                        )
                    per_stage[arm][metric] = tuple(None if v is None else float(v) for v in value)
                else:
                    whole[arm][metric] = finite_number(value, f"{at}.{metric}")
    return {arm: ArmPublished(whole[arm], per_stage[arm]) for arm in arms}


def _effects(
    doc: Mapping, published: Mapping[str, ArmPublished], labels: tuple[str, ...], where: str
) -> tuple[Effect, ...]:
    raw = doc.get("effects") or []
    if not isinstance(raw, list):
        raise CaseError(f"{where}.effects is {raw!r:.60}; give a list of {{arm, over, metric}}")
    effects = []
    for i, item in enumerate(raw):
        at = f"{where}.effects[{i}]"
        if not isinstance(item, Mapping) or not {"arm", "over", "metric"} <= set(item) <= {
            "arm",
            "over",
            "metric",
            "stage",
        }:
            raise CaseError(f"{at}: give {{arm: ARM, over: ARM, metric: METRIC}} (and stage: RATE for one stage's)")
        stage = item.get("stage", WHOLE)
        stage = f"{stage:g}" if isinstance(stage, (int, float)) and not isinstance(stage, bool) else stage
        if stage != WHOLE and stage not in labels:
            raise CaseError(f"{at}.stage is {stage!r:.40}; give one of the stages' rates {', '.join(labels)}")
        effect = Effect(item["arm"], item["over"], item["metric"], stage)
        for arm in (effect.arm, effect.over):
            if not isinstance(arm, str) or effect_value(published.get(arm), effect, labels) is None:
                raise CaseError(
                    f"{at}: {arm!r:.40} publishes no {effect.metric!r:.40} "
                    f"{'whole-run' if stage == WHOLE else f'at stage {stage}'}; an effect compares two "
                    "arms' published values"
                )
        effects.append(effect)
    return tuple(effects)


def effect_value(published: ArmPublished | None, effect: Effect, labels: tuple[str, ...]) -> float | None:
    """The published value of `effect.metric` an effect reads for one arm (None: not published)."""
    if published is None or not isinstance(effect.metric, str):
        return None
    if effect.stage == WHOLE:
        return published.whole.get(effect.metric)
    values = published.stages.get(effect.metric)
    return None if values is None else values[labels.index(effect.stage)]


def parse_case(path: Path) -> Case:
    """The case in `path`, every field checked (CaseError naming the field otherwise)."""
    try:
        doc = read_yaml(Path(path), "published case")
    except SettingsError as error:
        raise CaseError(str(error)) from None
    where = Path(path).name
    if not isinstance(doc, Mapping) or not all(isinstance(k, str) for k in doc):
        raise CaseError(f"{where}: expected a mapping (name, source, hardware, model, engine, workload, stages, ...)")
    hardware = built_doc(_HardwareDoc, mapping_of(doc, "hardware", where), f"{where}.hardware")
    require_fields(hardware, ("profile", "devices_per_replica", "replicas"), f"{where}.hardware")
    model = _text(doc, "model", where)
    try:
        load_geometry(model)
        load_hardware(hardware.profile)
    except (ValueError, OSError) as error:
        raise CaseError(f"{where}: {error}".splitlines()[0]) from None
    engine_raw = mapping_of(doc, "engine", where)
    engine, _, _ = parse_engine(engine_raw, f"{where}.engine")
    workload = mapping_of(doc, "workload", where)
    params = {k: v for k, v in workload.items() if k not in ("generator", "name")}
    try:
        SharedPrefixParams().replace(params)
    except (ValueError, TypeError) as error:
        raise CaseError(f"{where}.workload: {error}") from None
    if workload.get("generator") != "shared_prefix":
        raise CaseError(f"{where}.workload.generator is {workload.get('generator')!r:.40}; give shared_prefix")
    plan, loop = _load(doc, where)
    client = built_doc(_ClientDoc, mapping_of(doc, "client", where, required=False), f"{where}.client")
    arms = arms_of(doc, engine_raw, where)
    published = _published(doc, tuple(a.name for a in arms), len(plan.stages) if plan else 0, where)
    source = mapping_of(doc, "source", where, required=False)
    labels = tuple(f"{st.rate:g}" for st in plan.stages) if plan else ()
    return Case(
        _text(doc, "name", where, Path(path).stem),
        source,
        hardware.profile,
        hardware.devices_per_replica,
        hardware.replicas,
        model,
        engine,
        workload,
        plan,
        arms,
        published,
        Path(path),
        loop,
        _effects(doc, published, labels, where),
        max_concurrency=client.max_concurrency,
    )


def subsample(case: Case, replicas: int) -> Case:
    """`case` on `replicas` of its replicas at replicas/N of every stage's rate (each replica's load kept), its
    simulated throughput to be scaled back by N/replicas, a client's cap on requests in flight (or a closed
    loop's concurrency and requests) cut to the same share. Sound for routers that spread requests evenly
    whatever the content (round-robin, least-loaded); a prefix-aware router would also need the content cut."""
    if not 1 <= replicas <= case.replicas:
        raise CaseError(f"--replicas {replicas}: give 1 to {case.replicas} (the case's replicas)")
    k = replicas / case.replicas

    def share(n):
        return max(round(n * k), 1)

    plan, loop = case.plan, case.closed_loop
    if plan is not None:

        def scale(stage):
            return dataclasses.replace(stage, rate=stage.rate * k)

        plan = dataclasses.replace(
            plan,
            stages=tuple(scale(s) for s in plan.stages),
            warmup=None if plan.warmup is None else scale(plan.warmup),
        )
    if loop is not None:
        loop = ClosedLoop(share(loop.concurrency), share(loop.num_requests), int(loop.warmup_requests * k))
    cap = None if case.max_concurrency is None else share(case.max_concurrency)
    return dataclasses.replace(
        case, replicas=replicas, plan=plan, closed_loop=loop, fleet_scale=case.replicas / replicas, max_concurrency=cap
    )
