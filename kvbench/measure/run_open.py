"""Opening a run folder for a run (`kvbench run --out`): a folder is used once, so `open_run_dir` refuses one
that holds a run (`RunMode.FRESH`), removes that run's files (`OVERWRITE`: `RUN_FILES` and the engines' and
exports' folders, nothing else) or keeps what the interrupted run finished (`RESUME`: the same config, and the
points and records it finished). The folder's names and entry type are `run_folder.py`'s.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvbench.measure.records import RequestRecord
from kvbench.measure.run_folder import (
    CONFIG_YAML,
    ENGINES_DIR,
    LLMD_RESULTS_DIR,
    REQUESTS_JSONL,
    RUN_FILES,
    SUMMARY_JSON,
    VLLM_RESULTS_DIR,
    RunEntry,
    RunFolderError,
    RunMode,
    read_entries,
    records_by_run,
)
from kvbench.settings import SettingsError


class RunFolderInUse(SettingsError):
    """`--out` names a folder that already holds a run, or one that cannot be resumed as asked."""


@dataclass(frozen=True)
class Resumed:
    """What a resumed run keeps of the interrupted one: the entries of the points it finished, and the
    finished records of every point (by run_id); an unfinished point replays its own instead of sending them."""

    entries: Mapping[str, RunEntry] = field(default_factory=dict)
    records: Mapping[str, Sequence[RequestRecord]] = field(default_factory=dict)


def open_run_dir(run_dir: Path, config: Mapping, mode: RunMode) -> Resumed:
    """Check `run_dir` may take the run of `config` (its config.yaml form); for RESUME, what the interrupted
    run finished.

    A request is finished when requests.jsonl holds a record with its run_id, session and turn, whether it
    succeeded or failed (an error is an answer too; requests cut off by the interruption have no record). A
    point is finished when summary.json holds its entry and that entry is not marked `interrupted`. Resuming
    needs the same config (config.yaml); each unfinished point then sends only its unfinished requests, and
    its summary is the one an uninterrupted run would have made, timing apart (the engine restarts with a
    cold cache, and a `stop.duration_s` deadline counts from the resume).
    """
    if not _holds_run(run_dir):
        return Resumed()
    if mode is RunMode.FRESH:
        raise RunFolderInUse(f"{run_dir} already holds a run; give --resume to finish it or --overwrite to replace it")
    if mode is RunMode.OVERWRITE:
        _remove_run(run_dir)
        return Resumed()
    return _resumable(run_dir, config)


def _holds_run(run_dir: Path) -> bool:
    """A record in requests.jsonl or an entry in summary.json (an unreadable one counts: it was written)."""
    requests = run_dir / REQUESTS_JSONL
    if requests.exists() and requests.stat().st_size > 0:
        return True
    try:
        return bool(read_entries(run_dir)) if (run_dir / SUMMARY_JSON).exists() else False
    except RunFolderError:
        return True


def _remove_run(run_dir: Path) -> None:
    """The files `kvbench run` writes; anything else in the folder is left alone."""
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / ENGINES_DIR, ignore_errors=True)
    shutil.rmtree(run_dir / VLLM_RESULTS_DIR, ignore_errors=True)
    shutil.rmtree(run_dir / LLMD_RESULTS_DIR, ignore_errors=True)


def _resumable(run_dir: Path, config: Mapping) -> Resumed:
    stored = yaml.safe_load((run_dir / CONFIG_YAML).read_text()) if (run_dir / CONFIG_YAML).exists() else None
    if stored != config:
        keys = sorted(key for key, value in config.items() if (stored or {}).get(key) != value)
        raise RunFolderInUse(
            f"--resume: {run_dir / CONFIG_YAML} differs from this run's config "
            f"({', '.join(keys) or 'missing'}); resume with the same config, or give --overwrite"
        )
    entries = read_entries(run_dir) if (run_dir / SUMMARY_JSON).exists() else []
    records = records_by_run(run_dir)
    # A finished point whose records did not all survive (a torn last line is cut) is finished again, so that
    # its summary counts the records the folder keeps.
    finished = {
        entry.run_id: entry
        for entry in entries
        if not entry.interrupted
        and entry.summary["overall"]["requests"] == sum(not r.warmup for r in records.get(entry.run_id, ()))
    }
    unfinished = (record for run_id, own in records.items() if run_id not in finished for record in own)
    if any(record.ok and record.answer_tokens is None for record in unfinished):
        raise RunFolderInUse(
            f"--resume: {run_dir / REQUESTS_JSONL} was written before kvbench recorded answers, "
            "so its sessions cannot be continued; give --overwrite"
        )
    return Resumed(finished, records)
