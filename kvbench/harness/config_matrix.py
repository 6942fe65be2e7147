"""The experiment matrix's engine side and its size: each `engines:` entry checked and expanded by its sweep into
engine settings (`EngineSpec`), and the whole matrix (engine settings x workloads x loads x repeat) counted from
the lists' lengths and refused past `MAX_CELLS` before anything is expanded. `config.py` parses the rest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.settings import SettingsError


@dataclass(frozen=True)
class EngineSpec:
    """One engine configuration of the matrix (after sweeps are expanded)."""

    engine: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    # What a node must have to run this engine setting under `kvbench run --ray` (Ray resource names: CPU,
    # GPU, or a custom one), e.g. {GPU: 8}; without --ray it is not read.
    resources: Mapping[str, float] = field(default_factory=dict)


_ENGINE_KEYS = ("engine", "label", "settings", "sweep", "resources")


# Cells of a matrix (engine settings x workloads x load points x repetitions) `kvbench run` accepts: each cell
# is at least one engine start or one measured point, so past this a config is a typo (or a generated sweep
# gone wrong), and expanding it first would cost memory and minutes before any error.
MAX_CELLS = 10_000


def check_matrix_size(data: Mapping[str, Any], repeat: int) -> None:
    """Count the matrix from the lists' lengths, before anything is expanded; refuse it past MAX_CELLS, naming
    the count and its largest factors. Malformed entries count 1 here (their own checks name them after)."""
    factors: list[tuple[str, int]] = []
    settings = 0
    for index, raw in enumerate(list_field(data, "engines")):
        sweep = raw.get("sweep") if isinstance(raw, Mapping) else None
        lengths = (
            [
                (f"engines[{index}].sweep.{key}", len(values))
                for key, values in sweep.items()
                if isinstance(values, list) and values
            ]
            if isinstance(sweep, Mapping)
            else []
        )
        settings += math.prod(length for _, length in lengths)
        factors += lengths
    loads = sum(
        str(raw["stages"]).count(",") + 1 if isinstance(raw, Mapping) and raw.get("stages") else 1
        for raw in list_field(data, "loads")
    )  # a staged load point is one cell per stage
    factors += [("workloads", len(list_field(data, "workloads")) or 1), ("loads", loads or 1), ("repeat", repeat)]
    cells = max(settings, 1) * math.prod(length for name, length in factors if not name.startswith("engines["))
    if cells > MAX_CELLS:
        largest = sorted((item for item in factors if item[1] > 1), key=lambda item: -item[1])[:3]
        named = ", ".join(f"{name} {length:,}" for name, length in largest)
        raise SettingsError(
            f"the matrix has {cells:,} cells (engine settings x workloads x loads x repeat), more "
            f"than {MAX_CELLS:,}; largest factors: {named}; shorten those lists or split the config"
        )


def engine_specs(raw: Any, where: str) -> list[EngineSpec]:
    """One `engines:` entry (a mapping, or an adapter name) as its engine settings: one per combination of its
    sweep's values, labelled `label[key=value,...]`."""
    if isinstance(raw, str):
        raw = {"engine": raw}
    if not isinstance(raw, Mapping):
        raise SettingsError(f"{where}: expected a mapping with an 'engine' key")
    for key in raw:
        if key not in _ENGINE_KEYS:
            raise SettingsError(f"{where}: unknown key {key!r}; valid keys: {', '.join(_ENGINE_KEYS)}")
    if "engine" not in raw:
        raise SettingsError(f"{where}: missing 'engine' (the adapter name, e.g. kvengine or endpoint)")
    settings = mapping_field(raw, "settings", where)
    sweep = mapping_field(raw, "sweep", where)
    resources = mapping_field(raw, "resources", where)
    for key, amount in resources.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount >= 0:
            raise SettingsError(f"{where}.resources.{key}: expected a number >= 0 (e.g. GPU: 8), got {amount!r:.40}")
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise SettingsError(f"{where}.sweep.{key}: expected a non-empty list of values")
    keys = list(sweep)
    specs = []
    for combination in itertools.product(*(sweep[key] for key in keys)) if keys else [()]:
        swept = dict(zip(keys, combination))
        suffix = ",".join(f"{key}={value}" for key, value in swept.items())
        label = str(raw.get("label") or raw["engine"])
        specs.append(
            EngineSpec(
                engine=str(raw["engine"]),
                settings={**settings, **swept},
                label=f"{label}[{suffix}]" if suffix else label,
                resources=resources,
            )
        )
    return specs


def mapping_field(data: Mapping[str, Any], key: str, where: str) -> dict:
    """`data[key]` as a dict ({} when absent); anything else than a mapping is an error naming `where.key`."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SettingsError(f"{where}.{key}: expected a mapping (key: value), got {value!r:.80}")
    return dict(value)


def list_field(data: Mapping[str, Any], key: str) -> list:
    """`data[key]` as a list ([] when absent); anything else than a list is an error naming `key`."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SettingsError(f"{key}: expected a list, got {value!r:.80}")
    return value
