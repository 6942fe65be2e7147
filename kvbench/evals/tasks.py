"""The shipped lm-eval tasks: local YAML + JSONL in `kvbench/evals/data`, runnable offline.

lm-eval resolves a task's `data_files` against the working directory, so `render_tasks` copies the YAML into
a folder of the run with the data paths made absolute; that folder is what lm-eval's TaskManager includes.
"""

from __future__ import annotations

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
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise SettingsError(f"tasks: unknown {', '.join(unknown)}; shipped tasks: {', '.join(TASKS)}")
    return tuple(names)


def render_tasks(names: Sequence[str], folder: Path, data_dir: Path = DATA_DIR) -> Path:
    """Write the YAML of `names` into `folder` with absolute data paths; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in check_tasks(names):
        config = yaml.safe_load((data_dir / f"{name}.yaml").read_text())
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {split: str((data_dir / path).resolve()) for split, path in files.items()}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def corpus_text(data_dir: Path = DATA_DIR) -> str:
    """The perplexity corpus as one text (documents joined by blank lines): what the divergence pass reads."""
    import json

    with open(data_dir / "britannica_ppl.jsonl", encoding="utf-8") as handle:
        return "\n\n".join(json.loads(line)["text"] for line in handle if line.strip())
