"""The eval's lm-eval tasks: the shipped ones (local YAML + JSONL in `kvbench/evals/data`, runnable offline,
the default) and lm-eval's own registry (arc_easy, hellaswag, ...: `lm-eval ls tasks`), whose data lm-eval
loads from the Hugging Face hub or the local datasets cache.

lm-eval resolves a task's `data_files` against the working directory, so `render_tasks` copies the YAML into
a folder of the run with the data paths made absolute; that folder is what lm-eval's TaskManager includes.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvbench.settings import SettingsError

DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Task:
    """A shipped task: its kind, the metric the summary and the aggregate use, and that metric's chance level
    (None: no chance level, e.g. perplexity) that the baseline must beat for the task to say anything."""

    kind: str
    headline: str
    chance: float | None


# plays_mc's raw `acc` is below chance for SmolLM2 (8% on 12 documents): the three wrong lines are drawn from
# the whole play and are often shorter, and an unnormalised loglikelihood prefers short lines. `acc_norm`
# (loglikelihood per byte, lm-eval's length normalisation) removes that bias and is the headline.
TASKS = {
    "kvb_plays_mc": Task("multiple choice", "acc_norm", 0.25),
    "kvb_britannica_cloze": Task("completion", "exact_match", 0.0),
    "kvb_britannica_ppl": Task("perplexity", "word_perplexity", None),
}


def check_tasks(names: Sequence[str]) -> tuple[str, ...]:
    """`names` as given when each is a shipped task or one of lm-eval's (its registry is read only when a name
    is not shipped: that takes seconds)."""
    own = [name for name in names if name not in TASKS]
    if not own:
        return tuple(names)
    registry = lm_eval_task_names()
    unknown = [name for name in own if name not in registry]
    if unknown:
        close = [match for name in unknown for match in difflib.get_close_matches(name, registry, n=2)]
        raise SettingsError(
            f"tasks: unknown {', '.join(unknown)}; shipped tasks: {', '.join(TASKS)}; or one of "
            f"lm-eval's {len(registry)} tasks (`lm-eval ls tasks`)" + (f", e.g. {', '.join(close)}" if close else "")
        )
    return tuple(names)


@functools.lru_cache(maxsize=1)
def lm_eval_task_names() -> frozenset[str]:
    """Every task and group name lm-eval's own registry knows (its defaults; the shipped tasks are apart).
    Building it reads lm-eval's ~15,000 task YAMLs (~17 s on 2 cores), so the names are kept per lm-eval
    install (its version and folder) in `registry_cache_file()` and read from there afterwards."""
    try:
        distribution = importlib.metadata.distribution("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        raise SettingsError(
            "tasks: lm-eval is not installed; install kvbench's eval extra (pip install "
            "'kvbench[eval]') or use the shipped tasks " + ", ".join(TASKS)
        ) from None
    path = registry_cache_file(distribution)
    try:
        return frozenset(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass  # not kept yet, or unreadable: build it
    from lm_eval.tasks import TaskManager

    names = frozenset(TaskManager(include_defaults=True).all_tasks)
    with contextlib.suppress(OSError):  # a cache folder that cannot be written: built again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".json", dir=path.parent)  # several processes may build it at once
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(sorted(names), f)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return names


def registry_cache_file(distribution: importlib.metadata.Distribution) -> Path:
    """Where `lm_eval_task_names` keeps the registry of this lm-eval install: in the cache folder
    (`weights.cache_root()`), keyed by its version and where it is installed."""
    from kvbench.engines.kvengine.model.weights import cache_root  # torch comes with it: only when needed

    where = str(distribution.locate_file(""))
    key = hashlib.sha256(f"{distribution.version} {where}".encode()).hexdigest()[:16]
    return cache_root() / "_lm_eval" / f"tasks-{key}.json"


def render_tasks(names: Sequence[str], folder: Path, data_dir: Path = DATA_DIR) -> Path:
    """Write the YAML of the shipped tasks among `names` into `folder` with absolute data paths; returns
    `folder` (lm-eval's own tasks need no files)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (name for name in names if name in TASKS):
        config = yaml.safe_load((data_dir / f"{name}.yaml").read_text())
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {
            split: str((data_dir / path).resolve()) for split, path in files.items()
        }
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def corpus_text(data_dir: Path = DATA_DIR) -> str:
    """The perplexity corpus as one text (documents joined by blank lines): what the divergence pass reads."""
    with open(data_dir / "britannica_ppl.jsonl", encoding="utf-8") as handle:
        return "\n\n".join(json.loads(line)["text"] for line in handle if line.strip())
