"""Engine adapters by name, from the entry-point group `kvbench.engines` (third parties add theirs there)."""

from __future__ import annotations

from importlib.metadata import entry_points

from kvbench.engines.base import ENTRY_POINT_GROUP, AdapterFactory
from kvbench.settings import SettingsError


def available_engines() -> dict[str, object]:
    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def engine_factory(name: str) -> AdapterFactory:
    """The adapter class registered as `name`; an unknown name is an error listing the valid ones."""
    engines = available_engines()
    if name not in engines:
        raise SettingsError(
            f"engine: unknown {name!r}; valid engines: {', '.join(sorted(engines)) or '(none installed)'}"
        )
    return engines[name].load()
