"""The run folder, kvbench's central artefact: the names of its files, its entry type, and how it is opened,
read back and written. Every reader and writer takes the names from here.

    RUN_DIR/
      config.yaml            the config as run (a resume must give the same one)
      env.json               machine, versions, git commit, command
      requests.jsonl         one RequestRecord per request, appended as it finishes: the ground truth
      summary.json           {"runs": [RunEntry.to_json(), ...]}, one entry per point
      summary.csv, summary.md, ttft_cdf.png, throughput_vs_ttft_p99.png     laid out by measure/report.py
      engines/<label>/       each engine setting's adapter files: engine.log (engines/launch.py LOG_FILE),
                             steps.jsonl of our engine (engines/kvengine/adapter.py STEP_LOG), lm-eval output
      eval.json, eval.md, eval.csv, eval_summary.csv, eval_config.json      `kvbench eval`
      sim-validation.json    `kvbench validate-sim`
      compare.md             ci/nightly.sh (`kvbench compare --out`)
      .kvbench.lock          flock-ed by the run writing the folder, with its pid; gone once it ends (measure/folder_lock.py)

A point is one engine setting x workload x load point x repetition. A folder is used once: `open_run_dir`
(measure/run_open.py) refuses one that holds a run (`RunMode.FRESH`), removes that run's files (`OVERWRITE`)
or keeps what the interrupted run finished (`RESUME`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path

import yaml

from kvbench.measure.flags import WARM_CACHE, point_flags
from kvbench.measure.metrics import SLO, answer_sources, summarize_run
from kvbench.measure.records import PointId, RequestRecord, read_records
from kvbench.measure.write_errors import writing
from kvbench.settings import SettingsError

CONFIG_YAML = "config.yaml"
ENV_JSON = "env.json"
REQUESTS_JSONL = "requests.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
TTFT_CDF_PNG = "ttft_cdf.png"
THROUGHPUT_PNG = "throughput_vs_ttft_p99.png"
ENGINES_DIR = "engines"
REQUESTS_METRICS_JSONL = "requests_metrics.jsonl"  # per-request metrics for other tools (measure/export.py)
REQUESTS_METRICS_PARQUET = "requests_metrics.parquet"
VLLM_RESULTS_DIR = "vllm"  # one `vllm bench serve --save-result` JSON per point
LLMD_RESULTS_DIR = "llmd"  # one llm-d benchmark report (measure/llmd_report.py) per point
EVAL_JSON = "eval.json"
EVAL_MD = "eval.md"
EVAL_CSV = "eval.csv"
EVAL_SUMMARY_CSV = "eval_summary.csv"
EVAL_CONFIG_JSON = "eval_config.json"
EVAL_POSITIONS_PNG = "eval_positions.png"
EVAL_LAYERS_PNG = "eval_layers.png"
EVAL_LAYERS_CSV = "eval_layers.csv"
EVAL_TRADEOFF_MD = "eval_tradeoff.md"
EVAL_TRADEOFF_CSV = "eval_tradeoff.csv"
EVAL_TRADEOFF_PNG = "eval_tradeoff.png"
SIM_VALIDATION_JSON = "sim-validation.json"
PLAN_JSON = "plan.json"  # `kvbench plan`: every node count tried, per preset and KV dtype
PLAN_MD = "plan.md"
PLAN_PNG = "plan_slo_vs_nodes.png"
LOCK_FILE = ".kvbench.lock"  # held by the run writing the folder (measure/folder_lock.py)
# What `kvbench run` writes at the top of a run folder (ENGINES_DIR besides): what --overwrite removes.
RUN_FILES = (
    REQUESTS_JSONL,
    SUMMARY_JSON,
    SUMMARY_CSV,
    SUMMARY_MD,
    CONFIG_YAML,
    ENV_JSON,
    TTFT_CDF_PNG,
    THROUGHPUT_PNG,
    REQUESTS_METRICS_JSONL,
    REQUESTS_METRICS_PARQUET,
)

INTERRUPTED = "interrupted: the run was stopped before this point finished"
REBUILT = "rebuilt from requests.jsonl: the run stopped before it wrote its summary"


class RunFolderError(SettingsError):
    """The path is not a readable kvbench run folder (bad input: the CLI exits 2)."""


class RunMode(Enum):
    """What to do with a folder that already holds a run."""

    FRESH = "fresh"  # refuse it
    OVERWRITE = "overwrite"  # remove its files first
    RESUME = "resume"  # finish it


@dataclass(frozen=True, slots=True)
class RunEntry:
    """One point of summary.json. What only a live run knows (the engine's description, client lag, engine
    counters) is missing (None, "unknown", empty) in an entry rebuilt from the records.

    `summary` is `RunSummary.to_dict()`; `client`, `reconciliation` are their `to_dict()` forms.
    """

    run_id: str
    engine: str  # the engine setting's label
    workload: str
    load: str
    summary: Mapping
    repeat: int = 0
    valid: bool = True
    invalid_reasons: tuple[str, ...] = ()
    aborted: str | None = None
    interrupted: bool = False  # stopped before it finished (Ctrl-C, SIGTERM, or rebuilt after a kill)
    engine_name: str | None = None  # the adapter ("kvengine", "vllm", ...) or "sim"
    engine_settings: Mapping = field(default_factory=dict)
    kv_dtype: str = "unknown"
    engine_description: Mapping = field(default_factory=dict)
    workload_params: Mapping = field(default_factory=dict)
    started_at: float | None = None  # time.time() when the point started
    # The driver's time.time_ns() - perf_counter_ns(): a record's times plus this are epoch nanoseconds.
    clock_offset_ns: int | None = None
    cache_reset: bool | None = None
    client: Mapping | None = None
    answer_sources: Mapping[str, int] = field(default_factory=dict)
    reconciliation: Mapping | None = None
    server_counters: Mapping[str, float] | None = None
    kv_capacity: Mapping | None = None  # the device KV the engine states: {tokens, bytes, source}; None: not stated
    # our engine's prefill tokens beside running decodes as it resolved them (its /metrics); None: not stated
    prefill_beside_decodes: int | None = None

    @classmethod
    def of(
        cls,
        point: PointId,
        records: Sequence[RequestRecord],
        slo: SLO,
        invalid_reasons: Sequence[str] = (),
        aborted: str | None = None,
        resumed_at_ns: Sequence[int] = (),
        **known,
    ) -> "RunEntry":
        """The entry of one point, real or simulated: its identity, its records' summary and answer sources,
        valid when no reason speaks against it; `known` sets the other fields the caller knows. A resumed point's
        `resumed_at_ns` (when each later sitting began) keeps the time between sittings out of its throughput."""
        return cls(
            run_id=point.run_id,
            engine=point.engine,
            workload=point.workload,
            load=point.load,
            repeat=point.repeat,
            summary=summarize_run(records, slo, resumed_at_ns).to_dict(),
            answer_sources=answer_sources(records),
            valid=not invalid_reasons,
            invalid_reasons=tuple(invalid_reasons),
            aborted=aborted,
            interrupted=aborted in (INTERRUPTED, REBUILT),
            **known,
        )

    @property
    def cache_state(self) -> str | None:
        """ "warm cache" when the engine's cache was not reset before the point (its hit rate then includes
        earlier points' prompts, and may pass the oracle), "reset" when it was, None when unknown."""
        return None if self.cache_reset is None else "reset" if self.cache_reset else WARM_CACHE

    def to_json(self) -> dict:
        """Every field, `cache` (`cache_state`) and `flags` (`point_flags`): what a reader should see at once."""
        plain = {item.name: _plain(getattr(self, item.name)) for item in fields(self)}
        return {**plain, "cache": self.cache_state, "flags": list(point_flags(self))}

    @classmethod
    def from_json(cls, data: Mapping) -> "RunEntry":
        """An entry of summary.json as this or an older version wrote it: unknown keys are ignored, absent ones
        missing; an entry from before `invalid_reasons` gets the reasons it did record (an abort, client lag)."""
        names = {item.name for item in fields(cls)}
        values = {key: value for key, value in data.items() if key in names}
        reasons = data.get("invalid_reasons")
        values["invalid_reasons"] = tuple(_older_reasons(data) if reasons is None else reasons)
        return cls(**values)


def _older_reasons(data: Mapping) -> list[str]:
    client = data.get("client") or {}
    reasons = [f"aborted: {data['aborted']}"] if data.get("aborted") else []
    if client and not client.get("valid", True):
        reasons.append(f"client lag: {client.get('reason')}")
    return reasons


def _plain(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def engine_dir(run_dir: Path, label: str) -> Path:
    """The folder of one engine setting's files (its label made a file name)."""
    return run_dir / ENGINES_DIR / (re.sub(r"[^A-Za-z0-9_.=-]+", "_", label).strip("_") or "engine")


# --- writing -----------------------------------------------------------------------------------------------


def write_config_and_env(run_dir: Path, config: Mapping, env: Mapping) -> None:
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
    with writing(run_dir / CONFIG_YAML):
        (run_dir / CONFIG_YAML).write_text(yaml.safe_dump(dict(config), sort_keys=False))
    with writing(run_dir / ENV_JSON):
        (run_dir / ENV_JSON).write_text(json.dumps(env, indent=2))


def write_entries(run_dir: Path, entries: Sequence[RunEntry], notes: Sequence[str] = ()) -> None:
    data = {"runs": [entry.to_json() for entry in entries], "notes": list(notes)}
    replace_file(run_dir / SUMMARY_JSON, json.dumps(data, indent=2, default=str))


def replace_file(path: Path, text: str) -> None:
    """Write `text` beside `path`, then rename it over: a run killed meanwhile leaves the old file, never half."""
    partial = path.with_name(path.name + ".partial")
    with writing(path):
        try:
            partial.write_text(text)
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)  # a half-written copy would only take more of a full disk
            raise
        os.replace(partial, path)


# --- reading -----------------------------------------------------------------------------------------------


def read_entries(run_dir: Path) -> list[RunEntry]:
    path = run_dir / SUMMARY_JSON
    if not path.exists():
        raise RunFolderError(
            f"{run_dir}: no {SUMMARY_JSON}; is this a kvbench run folder? (`kvbench run ... --out DIR`)"
        )
    try:
        return [RunEntry.from_json(entry) for entry in json.loads(path.read_text())["runs"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise RunFolderError(
            f"{path}: not a kvbench summary ({type(exc).__name__}: {exc}); rerun `kvbench report`"
        ) from None


def records_by_run(run_dir: Path) -> dict[str, list[RequestRecord]]:
    """requests.jsonl's records by run_id, in file order (none when there is no file)."""
    out: dict[str, list[RequestRecord]] = {}
    path = run_dir / REQUESTS_JSONL
    for record in read_records(path) if path.exists() else ():
        out.setdefault(record.run_id, []).append(record)
    return out


@dataclass(frozen=True)
class RunFolder:
    """A run folder read back whole: its entries, their records by run_id, and the optional files."""

    path: Path
    entries: tuple[RunEntry, ...]
    records: Mapping[str, Sequence[RequestRecord]] = field(default_factory=dict)
    config: Mapping = field(default_factory=dict)
    env: Mapping = field(default_factory=dict)
    evals: Mapping[str, Mapping[str, float | None]] | None = None  # eval.json: setting -> metric -> value
    eval_directions: Mapping[str, Mapping[str, bool]] = field(default_factory=dict)  # setting -> metric -> higher?


def read_run_folder(path: Path) -> RunFolder:
    """summary.json (required), requests.jsonl, config.yaml, env.json and eval.json (optional)."""
    if not path.is_dir():
        raise RunFolderError(f"{path}: not a folder (give a kvbench run folder or a results/baselines/<name> folder)")
    return RunFolder(
        path=path,
        entries=tuple(read_entries(path)),
        records=records_by_run(path),
        config=_optional_mapping(path / CONFIG_YAML, yaml.safe_load),
        env=_optional_mapping(path / ENV_JSON, json.loads),
        evals=read_eval_metrics(path / EVAL_JSON),
        eval_directions=read_eval_directions(path / EVAL_JSON),
    )


def _optional_mapping(path: Path, parse: Callable[[str], object]) -> Mapping:
    if not path.exists():
        return {}
    try:
        data = parse(path.read_text())
    except (ValueError, yaml.YAMLError) as exc:
        raise RunFolderError(f"{path}: cannot parse ({exc})") from None
    return data if isinstance(data, Mapping) else {}


def read_eval_metrics(path: Path) -> dict[str, dict[str, float | None]] | None:
    """eval.json: {"settings": [{"kv_setting": NAME, "metrics": {METRIC: VALUE, ...}}, ...]}; None without one."""
    if not path.exists():
        return None
    try:
        return {
            str(item["kv_setting"]): {
                str(name): None if value is None else float(value) for name, value in item["metrics"].items()
            }
            for item in json.loads(path.read_text())["settings"]
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunFolderError(
            f'{path}: expected {{"settings": [{{"kv_setting": ..., "metrics": {{name: number}}}}]}} ({exc})'
        ) from None


def read_eval_directions(path: Path) -> dict[str, dict[str, bool]]:
    """eval.json's recorded `higher_is_better` per setting and metric (only the booleans; none in an eval.json
    written before kvbench recorded them). Call after `read_eval_metrics` has accepted the file."""
    if not path.exists():
        return {}
    out = {}
    for item in json.loads(path.read_text())["settings"]:
        recorded = item.get("higher_is_better")
        if isinstance(recorded, Mapping):
            out[str(item["kv_setting"])] = {str(k): v for k, v in recorded.items() if isinstance(v, bool)}
    return out
