"""rag-chat-mini with its clock sped up 20x, for tests whose subject is not the workload's timing.

rag-chat-mini's think times (0.2-2 s between turns) and session arrivals (2/s) are what a CPU engine's run waits on
most: a test that checks result files, a resume, a regression verdict or a cache counter waits seconds for them
per run and learns nothing from the wait. The same sessions, prompts and turns, with think times of 10-100 ms.
"""

from __future__ import annotations

from pathlib import Path

import yaml

SPEED_UP = 20.0


def quick_mini(folder: Path) -> str:
    """The path of a workload file (in `folder`) of rag-chat-mini with its think times and arrival gaps / 20."""
    path = folder / "rag-chat-mini-quick.yaml"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(
            yaml.safe_dump(
                {
                    "profile": "rag-chat-mini",
                    "name": "rag-chat-mini-quick",
                    "session_rate": 2.0 * SPEED_UP,
                    "think_time_median_s": 0.6 / SPEED_UP,
                    "think_time_min_s": 0.2 / SPEED_UP,
                    "think_time_max_s": 2.0 / SPEED_UP,
                }
            )
        )
    return str(path)
