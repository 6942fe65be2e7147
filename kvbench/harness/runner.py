"""Runs an experiment matrix and writes its run folder as it goes.

For each engine setting: start it, wait until healthy; for each workload, load point and repetition: reset
the engine's prefix cache, scrape its counters, replay the workload, scrape again, and rewrite the summary
files. A failure of one engine setting is recorded and the next one runs; nothing measured is lost.

A point is valid when its client kept up, it was not aborted, few enough of its requests failed
(`client.max_error_rate`) and no answer failed the client's checks (`stream_answer`); a point with too many failed requests, or aborted, is also a failure of the run.

How a run ends early: Ctrl-C (and SIGTERM, which `kvbench run` turns into Ctrl-C) stops the point in
progress, whose entry is built from the records already in requests.jsonl, writes the summary and stops
the engine. After a SIGKILL, `rebuild_entries` makes the entries from config.yaml and requests.jsonl alone.

A run folder is written by one run at a time (`measure/folder_lock.py`: a second exits 2 naming the holder).
A failed write of it (disk full, read-only, no permission) raises `RunWriteError` after the summary of the
records flushed so far is written where the disk allows. A run folder is used once (`measure/run_open.open_run_dir`): `RunMode.FRESH` refuses a folder that holds a run,
`OVERWRITE` removes that run's files first, `RESUME` continues it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvbench.engines.registry import engine_factory
from kvbench.harness.config import ExperimentConfig, load_config_file
from kvbench.harness.env import collect_env

# Progress, RunOutcome, UnreachableEngine and invalid_reasons are the runner's API too (re-exported).
from kvbench.harness.experiment import (  # noqa: F401
    Experiment,
    Progress,
    RunOutcome,
    UnreachableEngine,
    invalid_reasons,
    records_entry,
)
from kvbench.harness.preflight import check_cells, require_all_can_start
from kvbench.harness.ray_cluster import import_ray, run_on_ray
from kvbench.measure.export import write_exports
from kvbench.measure.folder_lock import locked_run_dir
from kvbench.measure.records import PointId, RecordWriter
from kvbench.measure.report import write_plots
from kvbench.measure.run_folder import (
    CONFIG_YAML,
    REBUILT,
    REQUESTS_JSONL,
    SUMMARY_JSON,
    RunEntry,
    RunMode,
    engine_dir,
    records_by_run,
    write_config_and_env,
)
from kvbench.measure.run_open import open_run_dir
from kvbench.measure.write_errors import RunWriteError
from kvbench.settings import SettingsError
from kvbench.workloads.profiles import load_workload


def validate_experiment(config: ExperimentConfig) -> None:
    """Fail on bad input before anything starts or is written: every engine adapter must resolve and accept its
    settings (adapters only check them when built: nothing is launched or created), every workload must load,
    with a session for every request of every load ladder."""
    for index, engine in enumerate(config.engines):
        try:
            engine_factory(engine.engine)(engine.settings, engine_dir(Path(), engine.label))
        except SettingsError as exc:
            raise SettingsError(f"engines[{index}] ({engine.label}): {exc}") from None
    plans = [load.plan for load in config.loads if load.plan is not None]
    for spec in config.workloads:
        load_workload(spec.name, seed=config.seed, num_sessions=1, overrides=spec.overrides, time_scale=spec.time_scale)
        if plans:  # every stage needs sessions of its own: count the workload's as it will be played
            sessions = len(spec.load(config.seed).sessions)
            for plan in plans:
                try:
                    plan.require_sessions(sessions)
                except ValueError as exc:
                    raise SettingsError(f"workload {spec.name}: {exc}") from None


def run_experiment(
    config: ExperimentConfig,
    run_dir: Path,
    progress: Progress = Progress(),
    mode: RunMode = RunMode.FRESH,
    ray_address: str | None = None,
) -> RunOutcome:
    """Run the matrix into `run_dir`; the summary files are written after every point and on any stop.

    With `ray_address` (a Ray cluster's address, or `auto`) every engine setting runs as a Ray task on a node
    with the resources its entry declares, its load workers as Ray actors (`harness/ray_cluster.py`)."""
    validate_experiment(config)
    if ray_address is not None:
        import_ray()  # a missing Ray is bad input, refused before the folder is made
    helps: dict = {}  # each installed engine's --help, run once here and reused at its launch
    if ray_address is None:  # on Ray the cells start on other nodes, which the driver cannot check
        require_all_can_start(check_cells(config, run_dir, helps))
    with locked_run_dir(run_dir):  # a second run on this folder is refused, naming the holder
        if ray_address is not None:
            return run_on_ray(config, run_dir, progress, mode, ray_address)
        resumed = open_run_dir(run_dir, config.to_dict(), mode)
        write_config_and_env(run_dir, config.to_dict(), collect_env())
        outcome = RunOutcome(run_dir)
        with RecordWriter(run_dir / REQUESTS_JSONL) as writer:
            experiment = Experiment(config, run_dir, writer, progress, resumed, outcome, helps=helps)
            try:
                for engine_index, engine in enumerate(config.engines):
                    experiment.run_engine(engine_index, engine)
            except RunWriteError:
                experiment.write_summaries(best_effort=True)  # from the records flushed so far, if the disk allows
                raise
            except BaseException:
                experiment.write_summaries()
                raise
            experiment.write_summaries()
        if outcome.entries:
            write_plots(run_dir, outcome.entries, experiment.ttfts)
            try:
                write_exports(
                    run_dir,
                    outcome.entries,
                    records_by_run(run_dir),
                    _loads(config),
                    config.client.api,
                    config.client.tokenizer,
                )
            except Exception as exc:  # noqa: BLE001 - what was measured is written; an export must not fail the run
                warning = f"requests_metrics / vllm exports not written: {type(exc).__name__}: {exc}"
                outcome.warnings.append(warning)
                progress.on_message(warning)
        return outcome


def _loads(config: ExperimentConfig) -> dict[str, dict]:
    """Each load point's LoadSpec fields by its label (what the vLLM result files say of the traffic)."""
    return {load.label: dataclasses.asdict(load) for load in config.load_specs()}


def rebuild_entries(run_dir: Path) -> list[RunEntry]:
    """Entries for a run folder without summary.json (its run was killed), from config.yaml and requests.jsonl.

    Each point's summary and validity are what they would have been, since both follow from the records; what
    only the live run knew (client lag, engine counters, engine description) is missing, and every entry is
    marked `interrupted`.
    """
    if not (run_dir / REQUESTS_JSONL).exists():
        raise FileNotFoundError(f"{run_dir}: no {SUMMARY_JSON} and no {REQUESTS_JSONL} (is this a kvbench run folder?)")
    config = load_config_file(run_dir / CONFIG_YAML)
    return [
        records_entry(PointId.parse(run_id), records, config, REBUILT)
        for run_id, records in records_by_run(run_dir).items()
    ]
