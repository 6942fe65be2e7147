"""A point's flags: every reason a reader should doubt or qualify one point of a run folder, defined once.

summary.json holds each entry's flags (`RunEntry.to_json`) and the run's notes (failures and warnings);
summary.md, `kvbench run`'s console and the HTML report all list `folder_flags`, so no output says "no flags"
while another lists some. Pure: takes entries, returns text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

WARM_CACHE = "warm cache"  # a point whose engine cache was not reset first (RunEntry.cache_state)
INVALID = "INVALID"


class RunEntry(Protocol):
    """What flags read of a point (`run_folder.RunEntry` has it; named here so that this module imports no
    run folder, which imports it)."""

    run_id: str
    invalid_reasons: Sequence[str]
    cache_state: str
    engine_description: Mapping[str, Any]
    reconciliation: Mapping[str, Any] | None
    answer_sources: Mapping[str, int]


@dataclass(frozen=True)
class Flag:
    """One flag: the point it belongs to (None: a note on the whole run) and its text."""

    run_id: str | None
    text: str

    @property
    def invalid(self) -> bool:
        return self.text.startswith(f"{INVALID}: ")


def point_flags(entry: RunEntry) -> tuple[str, ...]:
    """The point's flags: each invalid reason, a warm cache, cached tokens the server counters disagree with,
    and placeholder answers."""
    flags = [f"{INVALID}: {reason}" for reason in entry.invalid_reasons]
    if entry.cache_state == WARM_CACHE:
        note = entry.engine_description.get("cache_reset_note")
        flags.append(
            f"{WARM_CACHE}: the engine's prefix cache was not reset before this point"
            + (f" ({note})" if note else "")
            + "; its hit rate includes earlier points' prompts"
        )
    reconciliation = entry.reconciliation or {}
    if reconciliation.get("agree") is False:
        flags.append(f"cached tokens disagree with the server counters: {reconciliation.get('detail')}")
    placeholders = entry.answer_sources.get("placeholder")
    if placeholders:
        flags.append(f"{placeholders} answers were placeholders (server gave neither ids nor a tokenizer was set)")
    return tuple(flags)


def folder_flags(entries: Sequence[RunEntry], notes: Sequence[str] = ()) -> list[Flag]:
    """Every point's flags in entry order, then the run's notes."""
    flags = [Flag(entry.run_id, text) for entry in entries for text in point_flags(entry)]
    return flags + [Flag(None, note) for note in notes]


def read_notes(summary_json: Path) -> tuple[str, ...]:
    """The run's notes summary.json holds (none in a folder written before they were kept)."""
    try:
        notes = json.loads(summary_json.read_text()).get("notes") or ()
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(str(note) for note in notes)
