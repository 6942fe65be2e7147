"""Experiment configuration: engines x engine settings x workloads x load points, from YAML or flags.

The YAML form (every key optional except `engines`):

    name: rag-mini-sweep
    seed: 0
    repeat: 1                       # repetitions of every load point (records kept per repetition)
    engines:
      - engine: kvengine            # an adapter name (kvbench.engines entry point)
        label: ours                 # optional; defaults to the engine name plus swept values
        settings: {kv_capacity: 8192}
        sweep: {kv_dtype: [fp32, fp8_e4m3]}   # optional: one engine setting per combination
        resources: {GPU: 8}         # optional: what its node needs under `kvbench run --ray`
    workloads:
      - name: rag-chat-mini         # a profile, a trace path, or a YAML of generator parameters
        num_sessions: 10
        overrides: {turns_mean: 4}
    loads: [{rate: 1.0}, {concurrency: 4}]   # each: rate | request_rate | concurrency, optional burstiness
                                    # and max_concurrency (a cap on an open loop, as vLLM's); or stages:
      # - {stages: "3:20,10:20", warmup_stage: "15:50"}   # a Poisson ladder RATE:SECONDS (measure/stages.py):
      #   one point per measured stage, on one server that keeps its cache; stop: does not apply to it
    stop: {num_requests: 40, duration_s: 120, warmup_requests: 0}
    client: {api: completions, request_timeout_s: 600, header_timeout_s: 60, first_byte_timeout_s: 300,
             stall_timeout_s: 120, max_lag_ms: 10, max_error_rate: 0.1,
             isolation: null, tokenizer: null, tenant_api_keys: {tenant-a: key-a}, workers: 1}
    slo: {ttft_ms: 500, tpot_ms: 50}

Unknown keys anywhere are errors that name the valid keys. A run folder's config.yaml also carries
`schema_version` (SCHEMA_VERSION when written); harness/config_schema.py reads an older one as today's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvbench.harness.config_matrix import EngineSpec, check_matrix_size, engine_specs, list_field
from kvbench.measure.conversation import Isolation
from kvbench.measure.metrics import SLO
from kvbench.measure.schedule import MAX_COUNT, MAX_DURATION_S, LoadSpec
from kvbench.measure.stages import StagePlan
from kvbench.settings import SettingsError, bounded, build, read_yaml
from kvbench.workloads.profiles import load_workload
from kvbench.workloads.spec import Workload
from kvbench.workloads.text_datasets import needs_tokenizer

# The config.yaml form's version: bump it when a key is added or a default changes, and say in
# harness/config_schema.py what a config of the version before meant (compare fills it in before comparing).
SCHEMA_VERSION = 6


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    num_sessions: int | None = bounded(None, ge=1)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    time_scale: float = bounded(1.0, gt=0)

    def load(self, seed: int, vocab_size: int | None = None, sessions_needed: int | None = None) -> Workload:
        """The workload this names, generated (or read) with `seed`, token ids within `vocab_size`. A dataset
        file without `num_sessions` is read no further than `sessions_needed` (the most requests a point
        sends: each session sends at least one); a generated profile keeps its own count."""
        num_sessions = self.num_sessions
        if num_sessions is None and needs_tokenizer(self.name):
            num_sessions = sessions_needed
        return load_workload(
            self.name,
            seed=seed,
            num_sessions=num_sessions,
            overrides=self.overrides,
            vocab_size=vocab_size,
            time_scale=self.time_scale,
        )


@dataclass(frozen=True)
class LoadPoint:
    """One load point: `rate` new sessions/s, `request_rate` requests/s (vLLM's `--request-rate`; `inf` sends
    each request when it is ready) or `concurrency` requests in flight; `max_concurrency` caps an open loop.
    Or `stages` (`3:20,10:20`, after an optional `warmup_stage` `15:50`): a Poisson ladder, one point per
    measured stage (`plan`)."""

    rate: float | None = bounded(None, gt=0, unit="sessions/s")
    concurrency: int | None = bounded(None, ge=1)
    burstiness: float = bounded(1.0, gt=0)
    request_rate: float | str | None = bounded(None, gt=0, unit="requests/s")  # a number, or the word inf
    max_concurrency: int | None = bounded(None, ge=1)
    stages: str | None = None  # RATE:SECONDS,... as `--stages` writes them
    warmup_stage: str | None = None  # RATE:SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.request_rate, str) and self.request_rate.strip().lower() != "inf":
            raise ValueError(f"request_rate: expected a number > 0 or inf, got {self.request_rate!r:.40}")
        if self.warmup_stage is not None and self.stages is None:
            raise ValueError("warmup_stage: needs stages (the measured stages after it)")
        if self.stages is not None:
            given = [
                name
                for name in ("rate", "request_rate", "concurrency", "max_concurrency")
                if getattr(self, name) is not None
            ]
            if given:
                raise ValueError(f"stages set the load (Poisson at each stage's rate): leave out {', '.join(given)}")
            self.plan  # noqa: B018 - parsed here, so that a bad stage is refused with the config

    @property
    def plan(self) -> StagePlan | None:
        """The stages as a plan (None: not a staged load point)."""
        if self.stages is None:
            return None
        return StagePlan.parse(self.stages, self.warmup_stage)

    @property
    def requests_per_s(self) -> float | None:
        """`request_rate` as a number (infinity for `inf`)."""
        return float("inf") if isinstance(self.request_rate, str) else self.request_rate

    def load_spec(self, stop: StopSpec | None = None) -> LoadSpec:
        """The load of an unstaged point under `stop`'s conditions (none: just the load, as the config check
        builds it); ValueError names a load that cannot be (e.g. concurrency with a rate)."""
        stop = stop or StopSpec()
        return LoadSpec(
            rate=self.rate,
            concurrency=self.concurrency,
            burstiness=self.burstiness,
            request_rate=self.requests_per_s,
            max_concurrency=self.max_concurrency,
            num_requests=stop.num_requests,
            duration_s=stop.duration_s,
            warmup_requests=stop.warmup_requests,
        )


@dataclass(frozen=True)
class StopSpec:
    num_requests: int | None = bounded(None, ge=1, le=MAX_COUNT, help="stop after this many requests")
    duration_s: float | None = bounded(
        None, gt=0, le=MAX_DURATION_S, unit="s", help="stop sending after this many seconds"
    )
    warmup_requests: int = bounded(0, ge=0, le=MAX_COUNT, help="requests excluded from metrics at the start")


@dataclass(frozen=True)
class ClientSpec:
    api: str = bounded("completions", choices=("completions", "chat"), help="endpoint to use")
    request_timeout_s: float = bounded(600.0, gt=0, unit="s")
    stall_timeout_s: float = bounded(120.0, gt=0, unit="s")
    # Servers send response headers before they schedule the prompt: a minute without them is a hung server.
    header_timeout_s: float = bounded(60.0, gt=0, unit="s")
    # Headers to the first body byte: queueing plus prefill, which for a long prompt on a loaded server takes minutes.
    first_byte_timeout_s: float = bounded(300.0, gt=0, unit="s")
    max_lag_ms: float = bounded(10.0, gt=0, unit="ms", help="client lag past which a point is invalid (exit 1)")
    max_error_rate: float = bounded(
        0.1, ge=0, le=1
    )  # a point with a larger share of failed requests (or all) is invalid
    # The oracle follows the engine's own isolation rule (its adapter says which); set this only to override
    # it: strict | shared-prefix | shared-all (any tenant's prefix reused); `shared` reads as shared-all.
    isolation: Isolation | None = None
    tokenizer: str | None = bounded(
        None, help="local tokenizer folder (re-tokenizing answers, chat prompts, text datasets)"
    )
    ignore_eos: bool = bounded(
        True,
        help="ask the server to generate every output token (vLLM's ignore_eos), so output lengths are the workload's",
    )
    health_timeout_s: float = bounded(600.0, gt=0, unit="s")
    tenant_api_keys: Mapping[str, str] = field(default_factory=dict)  # tenant -> API key, for multi-tenant engines
    # Load-generator processes per point, each with its own event loop and whole sessions of one schedule
    # (harness/workers.py); 1 plays the point in the driver's own process.
    workers: int = bounded(
        1,
        ge=1,
        help="load-generator processes per point, each with its own event loop and "
        "whole sessions of one schedule (1: this process)",
    )

    def __post_init__(self) -> None:
        if self.isolation is not None:
            object.__setattr__(self, "isolation", Isolation.parse(self.isolation))
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api: unknown {self.api!r}; use completions or chat")


@dataclass(frozen=True)
class ExperimentConfig:
    engines: tuple[EngineSpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    loads: tuple[LoadPoint, ...]
    stop: StopSpec = StopSpec()
    client: ClientSpec = ClientSpec()
    slo: SLO = SLO()
    seed: int = 0
    repeat: int = 1
    name: str = "run"

    def load_specs(self) -> list[LoadSpec]:
        """Every load point's load, in order; a staged load point gives one per measured stage (without the stop
        conditions: the stages are the load)."""
        specs = []
        for point in self.loads:
            if point.plan is not None:
                specs += [LoadSpec(rate=staged.stage.rate, stage=staged) for staged in point.plan.points()]
                continue
            specs.append(point.load_spec(self.stop))
        return specs

    def to_dict(self) -> dict:
        """The config.yaml form, with its schema_version."""
        return {**_plain(asdict(self)), "schema_version": SCHEMA_VERSION}


_TOP_KEYS = ("schema_version", "name", "seed", "repeat", "engines", "workloads", "loads", "stop", "client", "slo")


@dataclass(frozen=True)
class TopScalars:
    """The scalar top-level keys, checked like every other section."""

    name: str = "run"
    seed: int = bounded(0, ge=0, help="workload and arrival seed")
    repeat: int = bounded(1, ge=1, help="repetitions of every load point")


def parse_config(data: Mapping[str, Any], where: str = "config") -> ExperimentConfig:
    """Validate a config mapping (from YAML) and expand engine sweeps; errors read `WHERE: field.path: ...`."""
    try:
        return _parse(data)
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc}") from None


def _parse(data: Mapping[str, Any]) -> ExperimentConfig:
    if not isinstance(data, Mapping):
        raise SettingsError(f"expected a mapping at the top level, got {type(data).__name__}")
    for key in data:
        if key not in _TOP_KEYS:
            raise SettingsError(f"unknown key {key!r}; valid keys: {', '.join(_TOP_KEYS)}")
    version = data.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise SettingsError(
            f"schema_version: {version!r:.40} is not a config.yaml version this kvbench reads "
            f"(1..{SCHEMA_VERSION}); drop the key to read the file as today's form"
        )
    scalars = build(TopScalars, {key: data[key] for key in ("name", "seed", "repeat") if key in data}, "")
    check_matrix_size(data, scalars.repeat)
    engines = tuple(
        spec for index, raw in enumerate(list_field(data, "engines")) for spec in engine_specs(raw, f"engines[{index}]")
    )
    if not engines:
        raise SettingsError("engines: give at least one engine, e.g. engines: [{engine: kvengine}]")
    workloads = tuple(
        build(WorkloadSpec, raw if isinstance(raw, Mapping) else {"name": raw}, f"workloads[{index}]")
        for index, raw in enumerate(list_field(data, "workloads") or ["rag-chat-mini"])
    )
    loads = tuple(
        build(LoadPoint, raw, f"loads[{index}]")
        for index, raw in enumerate(list_field(data, "loads") or [{"concurrency": 1}])
    )
    config = ExperimentConfig(
        engines=engines,
        workloads=workloads,
        loads=loads,
        stop=build(StopSpec, data.get("stop"), "stop"),
        client=build(ClientSpec, data.get("client"), "client"),
        slo=build(SLO, data.get("slo"), "slo"),
        seed=scalars.seed,
        repeat=scalars.repeat,
        name=scalars.name,
    )
    for index, load in enumerate(config.loads):
        try:
            load.load_spec()
        except ValueError as exc:
            raise SettingsError(f"loads[{index}]: {exc}") from None
    if config.client.workers > 1 and any(load.plan is not None for load in config.loads):
        raise SettingsError(
            "client.workers: load stages are played by one load process (the driver's own); "
            "set workers to 1 for a config with stages"
        )
    return config


def load_config_file(path: Path) -> ExperimentConfig:
    return parse_config(read_yaml(path, "config") or {}, where=str(path))


def _plain(value: Any) -> Any:
    """Mappings and tuples as plain dicts and lists, enum members as their values, for YAML/JSON."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
