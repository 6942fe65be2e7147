"""Baselines: a run folder promoted to `results/baselines/<name>/`, with where and how it was measured.

A baseline holds the run's result files (so `kvbench compare` can bootstrap from its per-request records)
and `provenance.json`: the git commit, machine and command of the run, when it ran and when it was promoted.
Promoting replaces the whole folder, so no file of an older baseline survives next to the new one.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvbench.harness.env import collect_env
from kvbench.measure.run_folder import (
    CONFIG_YAML,
    ENV_JSON,
    EVAL_JSON,
    REQUESTS_JSONL,
    SUMMARY_CSV,
    SUMMARY_JSON,
    SUMMARY_MD,
    RunFolderError,
    read_entries,
)

DEFAULT_ROOT = Path("results/baselines")
PROVENANCE_JSON = "provenance.json"
# summary.json is required; the rest are copied when present and listed as missing otherwise.
BASELINE_FILES = (SUMMARY_JSON, SUMMARY_CSV, SUMMARY_MD, CONFIG_YAML, ENV_JSON, REQUESTS_JSONL, EVAL_JSON)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class BaselineError(ValueError):
    """Bad input to `promote` (not a run folder, an unusable name)."""


@dataclass(frozen=True)
class Provenance:
    """Where a baseline's numbers come from. Fields the run folder did not record are None."""

    name: str
    source_run: str
    git_commit: str | None
    cpu: str | None
    cpu_count: int | None
    gpu: list[str] | None
    run_started: str | None  # UTC, ISO 8601: the first measured point of the run
    promoted_at: str  # UTC, ISO 8601
    command: str | None  # the command that made the run (env.json)
    promoted_by: str  # the command that promoted it
    files: list[str]
    missing_files: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def promote(run_dir: Path, name: str, root: Path = DEFAULT_ROOT, promoted_by: str | None = None) -> Provenance:
    """Copy the run folder's result files into `root/name/` (replacing it) and write provenance.json."""
    if not _NAME.match(name):
        raise BaselineError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (e.g. nightly-cpu)")
    if not (run_dir / SUMMARY_JSON).is_file():
        raise BaselineError(f"{run_dir}: no {SUMMARY_JSON}; give a kvbench run folder (`kvbench run ... --out DIR`)")
    env = _read_json(run_dir / ENV_JSON)
    present = [file for file in BASELINE_FILES if (run_dir / file).is_file()]
    provenance = Provenance(
        name=name,
        source_run=str(run_dir.resolve()),
        git_commit=env.get("git_commit") or collect_env().get("git_commit"),
        cpu=env.get("cpu"),
        cpu_count=env.get("cpu_count"),
        gpu=env.get("gpu"),
        run_started=_run_started(run_dir),
        promoted_at=_iso(time.time()),
        command=env.get("command"),
        promoted_by=promoted_by if promoted_by is not None else " ".join(sys.argv),
        files=present,
        missing_files=[file for file in BASELINE_FILES if file not in present],
    )
    root.mkdir(parents=True, exist_ok=True)
    # Build beside the target and swap it in, so an interrupted promotion never leaves a half baseline.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        for file in present:
            shutil.copy2(run_dir / file, staging / file)
        (staging / PROVENANCE_JSON).write_text(json.dumps(provenance.to_dict(), indent=2) + "\n")
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return provenance


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _run_started(run_dir: Path) -> str | None:
    """When the first point started; None when summary.json cannot be read or no entry says."""
    try:
        entries = read_entries(run_dir)
    except RunFolderError:
        return None
    started = [entry.started_at for entry in entries if isinstance(entry.started_at, (int, float))]
    return _iso(min(started)) if started else None


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
