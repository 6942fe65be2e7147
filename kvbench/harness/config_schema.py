"""A run folder's config.yaml read as today's form: what `kvbench compare` compares.

config.yaml carries `schema_version` (config.SCHEMA_VERSION when it was written; a file without it is
version 1). `current` upgrades an older form one version at a time, saying what a config of the version
before meant, then fills every key still missing from a section with today's default. Two folders whose
configs differ only by keys that were added since (with their defaults) then compare equal; a key set to a
value other than its default, in either folder, is still a difference.

Version history (add a step to _UPGRADES whenever SCHEMA_VERSION is bumped):
    1 -> 2  client.header_timeout_s, first_byte_timeout_s, max_error_rate and workers were added (filled with
            their defaults: version 1 had one request timeout, kept every point, and one load process);
            client.isolation's default became null (the engine's own rule) instead of `shared`, written
            into every version-1 config that did not set it: `shared` in a version-1 file reads as the default.
            (A version-1 oracle shared every tenant's prefix; the two differ only on multi-tenant workloads,
            which the per-setting workload params still tell apart.)
    2 -> 3  our engine gained max_prefill_beside_decodes (default 32: prefill beside running decodes is capped);
            before, a step's prefill beside decodes was bounded by max_step_tokens alone, so a kvengine entry
            without the key gets its max_step_tokens (default 512) there: the rule the run was made with.
    3 -> 4  max_prefill_beside_decodes' default became 128 (from 32): a version-3 kvengine entry without the key
            gets 32, the default it ran with.
    4 -> 5  a load point may be `stages` (with `warmup_stage`), a Poisson ladder; a version-4 load point has
            neither key, and load points are compared as written (not filled), so nothing changes.
    5 -> 6  max_prefill_beside_decodes' default became auto (timed at start within decode_stall_factor, a new
            key, default 3): a version-5 kvengine entry without the key gets 128, the default it ran with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.harness.config import SCHEMA_VERSION, ExperimentConfig

VERSION_KEY = "schema_version"


@dataclass(frozen=True)
class CurrentConfig:
    """A stored config in today's form, and what was done to get there (for the comparison's notes)."""

    config: dict
    version: int  # the version it was stored as
    filled: tuple[str, ...]  # keys filled with today's default, as section.key


def _v1_to_v2(config: dict) -> dict:
    client = dict(config.get("client") or {})
    if client.get("isolation") == "shared":
        client["isolation"] = None
    return {**config, "client": client}


# Our engine's step budget before version 3 (kvengine's max_step_tokens default then and now).
_V2_STEP_TOKENS = 512
# max_prefill_beside_decodes' default in version 3, and in versions 4-5.
_V3_PREFILL_BESIDE_DECODES = 32
_V5_PREFILL_BESIDE_DECODES = 128


def kvengine_settings_as_run(settings: Mapping[str, Any], version: int) -> dict:
    """A kvengine entry's settings as written by config.yaml `version`, with what that version's engine did
    for settings added or changed since (2 -> 3: prefill beside decodes bounded by the step budget alone;
    3 -> 4: that budget's default was 32; 5 -> 6: it was 128, not auto)."""
    out = dict(settings)
    if version < 3 and "max_prefill_beside_decodes" not in out:
        out["max_prefill_beside_decodes"] = out.get("max_step_tokens", _V2_STEP_TOKENS)
    elif version < 4 and "max_prefill_beside_decodes" not in out:
        out["max_prefill_beside_decodes"] = _V3_PREFILL_BESIDE_DECODES
    elif version < 6 and "max_prefill_beside_decodes" not in out:
        out["max_prefill_beside_decodes"] = _V5_PREFILL_BESIDE_DECODES
    return out


def _kvengine_as_run(config: dict, version: int) -> dict:
    engines = [
        {**entry, "settings": kvengine_settings_as_run(entry.get("settings") or {}, version)}
        if isinstance(entry, Mapping) and entry.get("engine") == "kvengine"
        else entry
        for entry in config.get("engines") or ()
    ]
    return {**config, "engines": engines}


_UPGRADES: dict[int, Callable[[dict], dict]] = {
    1: _v1_to_v2,
    2: lambda config: _kvengine_as_run(config, 2),
    3: lambda config: _kvengine_as_run(config, 3),
    4: lambda config: config,
    5: lambda config: _kvengine_as_run(config, 5),
}


def defaults() -> dict:
    """Today's default of every key of the sections that are not per engine setting (stop, client, slo, ...)."""
    out = ExperimentConfig(engines=(), workloads=(), loads=()).to_dict()
    for per_setting in ("engines", "workloads", "loads", "name", VERSION_KEY):
        out.pop(per_setting)
    return out


def current(stored: Mapping[str, Any]) -> CurrentConfig:
    """`stored` (a config.yaml mapping) upgraded to SCHEMA_VERSION, then its missing keys filled with defaults."""
    version = stored.get(VERSION_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ValueError(
            f"{VERSION_KEY}: {version!r:.40} is not a config.yaml version this kvbench reads "
            f"(1..{SCHEMA_VERSION}); compare it with the kvbench that wrote it"
        )
    config = dict(stored)
    for step in range(version, SCHEMA_VERSION):
        config = _UPGRADES[step](config)
    filled: list[str] = []
    for section, default in defaults().items():
        value = config.get(section)
        if isinstance(default, Mapping) and isinstance(value, Mapping):
            missing = [key for key in default if key not in value]
            config[section] = {**value, **{key: default[key] for key in missing}}
            filled += [f"{section}.{key}" for key in missing]
        elif section not in config or value is None:
            config[section] = default
            filled.append(section)
    config[VERSION_KEY] = SCHEMA_VERSION
    return CurrentConfig(config, version, tuple(filled))
