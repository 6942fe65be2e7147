"""SLA search on real engines: the highest load that meets every SLO, found by real runs.

`kvbench run ... --find-max request-rate|concurrency --slo ttft_p99_ms=500` runs one probe per load it tries,
each a whole `run_experiment` of one load point into its own folder (`OUT/probes/NN-<load>`): the engine is
started for it and its prefix cache reset before it (as every kvbench point), so no probe inherits another's
cache. A probe meets the SLO when its point is valid, no request failed and every target (the targets of
`kvbench plan --slo`, `sim/plan.py`) is within its limit.

The search (`search_max`) mirrors `kvbench plan`'s, upside down: from the start load it doubles while probes
meet the SLO (halves while they miss, for a start that is already too high), then bisects between the highest
load that met and the lowest that missed, until they are one apart (concurrency) or within `rel_tol` of each
other (request rate). The answer is the highest load that met, with its interval [answer, lowest miss). More
load is assumed never to help; that is checked, not trusted (twice the lowest miss is probed too, as `kvbench
plan` probes one node above its answer), and a probe against the trend is reported in `non_monotone`.
A concurrency answer is never above the most requests a probe had in flight (`capped` says so), and a probe
invalid only for the client's own lag is client-bound: a search that found nothing for that reason says so
rather than that the SLO is not met.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.harness.config import ExperimentConfig
from kvbench.harness.experiment import CLIENT_LAG
from kvbench.harness.runner import Progress, run_experiment
from kvbench.measure import metrics
from kvbench.measure.run_folder import RunEntry, RunMode, records_by_run
from kvbench.sim.plan import SloTarget, meets_all

REQUEST_RATE = "request-rate"
CONCURRENCY = "concurrency"
FIND_MAX_JSON = "find_max.json"
PROBES_DIR = "probes"


@dataclass(frozen=True, slots=True)
class Probe:
    """One load tried: its SLO values, verdict, and the folder of its run."""

    load: float
    meets: bool
    values: Mapping[str, float | None]  # SloTarget.name -> the probe's value (None: missing)
    requests: int
    errors: int
    invalid_reasons: tuple[str, ...]
    run_dir: str
    peak_in_flight: int | None = None  # the most requests it had in flight at once (None: not measured)

    @property
    def client_bound(self) -> bool:
        """Invalid for the client's own lag alone: the engine's side was not measured, not found wanting."""
        return bool(self.invalid_reasons) and all(reason.startswith(CLIENT_LAG) for reason in self.invalid_reasons)


@dataclass(frozen=True, slots=True)
class MaxSearch:
    mode: str
    answer: float | None  # the highest load that met every SLO; None: not even the lowest tried
    missed_at: float | None  # the lowest load above the answer that missed (the interval's open end)
    probes: tuple[Probe, ...]  # in the order they ran
    non_monotone: tuple[str, ...]
    capped: str | None = None  # why the answer is lower than the highest load that met (what was measured)

    @property
    def client_bound(self) -> bool:
        """No answer, and some probe was invalid only for the client's lag: the client, not the SLO, stopped it."""
        return self.answer is None and any(probe.client_bound for probe in self.probes)

    def to_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "client_bound": self.client_bound,
            "probes": [{**dataclasses.asdict(probe), "client_bound": probe.client_bound} for probe in self.probes],
        }


def search_max(
    evaluate: Callable[[float], Probe],
    start: float,
    integer: bool,
    max_probes: int = 12,
    rel_tol: float = 0.1,
    on_probe: Callable[[Probe], None] | None = None,
) -> MaxSearch:
    """The highest load with `evaluate(load).meets` (module doc); at most `max_probes` probes."""
    if not start > 0 or (integer and start < 1):
        raise ValueError(f"the search starts at a load > 0 (>= 1 for concurrency), got {start}")
    tried: dict[float, Probe] = {}

    def norm(load: float) -> float:
        return float(max(int(load), 1)) if integer else load

    def probe(load: float) -> Probe | None:
        if load not in tried:
            if len(tried) >= max_probes:
                return None
            tried[load] = evaluate(load)
            if on_probe is not None:
                on_probe(tried[load])
        return tried[load]

    met, missed = None, None
    load = norm(float(start))
    if probe(load).meets:
        met = load
        while (higher := probe(norm(load * 2))) is not None and higher.meets:
            load = met = norm(load * 2)
        missed = norm(load * 2) if higher is not None else None
    else:
        missed = load
        while not (integer and load <= 1) and (lower := probe(norm(load / 2))) is not None:
            load = norm(load / 2)
            if lower.meets:
                met = load
                break
            missed = load
    while met is not None and missed is not None and not _close(met, missed, integer, rel_tol):
        middle = norm((met + missed) / 2)
        result = probe(middle)
        if result is None:
            break
        if result.meets:
            met = middle
        else:
            missed = middle
    if met is not None and missed is not None:
        probe(norm(missed * 2))  # the monotonicity check: twice the miss must miss too
    probes = tuple(tried.values())
    answer, capped = _within_measured(met, probes, integer)
    return MaxSearch(
        mode=CONCURRENCY if integer else REQUEST_RATE,
        answer=answer,
        missed_at=missed,
        probes=probes,
        non_monotone=_non_monotone(probes),
        capped=capped,
    )


def _within_measured(met: float | None, probes: Sequence[Probe], integer: bool) -> tuple[float | None, str | None]:
    """A concurrency answer no higher than the most requests any probe had in flight: a workload that cannot
    fill more slots answers with the slots it filled, not with the load it was offered."""
    peaks = [probe.peak_in_flight for probe in probes if probe.peak_in_flight is not None]
    if not integer or met is None or not peaks or met <= max(peaks):
        return met, None
    return float(max(peaks)), (
        f"concurrency {met:g} met the SLO but at most {max(peaks)} requests were ever in "
        f"flight: the workload cannot fill more, so the answer is {max(peaks)}"
    )


def _close(met: float, missed: float, integer: bool, rel_tol: float) -> bool:
    return missed - met <= 1 if integer else missed <= met * (1 + rel_tol)


def _non_monotone(probes: Sequence[Probe]) -> tuple[str, ...]:
    ordered = sorted(probes, key=lambda probe: probe.load)
    return tuple(
        f"load {lower.load:g} misses the SLO but {higher.load:g} meets it"
        for lower, higher in zip(ordered, ordered[1:])
        if not lower.meets and higher.meets
    )


def probe_verdict(
    entry: RunEntry, targets: Sequence[SloTarget], load: float, run_dir: Path, peak: int | None = None
) -> Probe:
    """The probe of one finished point: its targets' values read from its summary, `peak` its most in flight."""
    overall = entry.summary["overall"]
    values = {}
    for target in targets:
        distribution = overall.get(f"{target.metric}_ms")
        values[target.name] = float(distribution[target.stat]) if distribution else None
    errors = overall["requests"] - overall["completed"]
    return Probe(
        load,
        entry.valid and meets_all(targets, values, errors),
        values,
        overall["requests"],
        errors,
        tuple(entry.invalid_reasons),
        str(run_dir),
        peak,
    )


def find_max(
    config: ExperimentConfig,
    mode: str,
    targets: Sequence[SloTarget],
    out: Path,
    start: float,
    max_probes: int = 12,
    rel_tol: float = 0.1,
    progress: Progress = Progress(),
    on_probe: Callable[[Probe], None] | None = None,
) -> MaxSearch:
    """Search `config`'s (one) engine and workload for the highest `mode` load meeting `targets`, a real run per
    probe; `config`'s first load point gives what else the probes keep (burstiness, max_concurrency)."""
    if len(config.engines) != 1 or len(config.workloads) != 1:
        raise ValueError(
            "--find-max searches one engine setting on one workload; the config has "
            f"{len(config.engines)} engine settings and {len(config.workloads)} workloads (pick one, "
            "e.g. --set kv_dtype=fp8_e4m3 for the main job)"
        )
    base = config.loads[0]
    out.mkdir(parents=True, exist_ok=True)
    count = iter(range(1, 1 << 30))

    def evaluate(load: float) -> Probe:
        if mode == CONCURRENCY:
            point = {"concurrency": int(load), "request_rate": None, "max_concurrency": None}
        else:
            point = {"request_rate": load, "concurrency": None}
        probe_config = dataclasses.replace(config, loads=(dataclasses.replace(base, rate=None, **point),))
        probe_dir = out / PROBES_DIR / f"{next(count):02d}-{mode}-{load:g}"
        outcome = run_experiment(probe_config, probe_dir, progress, RunMode.OVERWRITE)
        if not outcome.entries:
            return Probe(
                load,
                False,
                {t.name: None for t in targets},
                0,
                0,
                tuple(outcome.failures) or ("no point ran",),
                str(probe_dir),
            )
        entry = outcome.entries[0]
        return probe_verdict(
            entry, targets, load, probe_dir, metrics.peak_in_flight(records_by_run(probe_dir).get(entry.run_id, ()))
        )

    search = search_max(
        evaluate, start, integer=mode == CONCURRENCY, max_probes=max_probes, rel_tol=rel_tol, on_probe=on_probe
    )
    targets_text = {t.name: t.limit_ms for t in targets}
    (out / FIND_MAX_JSON).write_text(json.dumps({"slo": targets_text, **search.to_dict()}, indent=2))
    return search
