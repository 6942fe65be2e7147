"""Strict settings: a mapping from YAML or flags into a frozen dataclass, naming every unknown key and bad value.

A field's accepted range is declared once, beside the field, with `bounded(...)`; `build` checks it and names
the field and the range in its message.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import reprlib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class SettingsError(ValueError):
    """Bad user input; the message names the field, what is wrong and the valid choices."""


# How a message quotes a value it refuses: a 3 MB string or a 4,000-digit integer is cut, never echoed whole.
MAX_SHOWN_CHARS = 60
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxlong = _SHOWN.maxother = 40
_SHOWN.maxlist = _SHOWN.maxdict = 4


def shown(value: object) -> str:
    """`value` as an error message quotes it: its repr, cut to at most MAX_SHOWN_CHARS characters."""
    text = _SHOWN.repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


# A settings document's values counted with every alias expanded: kvbench's own configs hold a few hundred;
# YAML aliases nested in aliases (an "alias bomb") reach billions while the file stays a few lines, and the first
# copy of the config (to_dict, config.yaml) would then fill the memory.
MAX_YAML_VALUES = 100_000


def read_yaml(path: Path, what: str, max_values: int = MAX_YAML_VALUES) -> Any:
    """The document of a YAML file (None if empty); SettingsError naming `what` and the file when it cannot be
    read, is not UTF-8 text, is not valid YAML, or expands (aliases counted each time they are used) to more
    than `max_values` values."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"{what}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{what}: {path} is not a UTF-8 text file (a YAML file was expected)") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{what}: {path} is not valid YAML: {exc}") from None
    check_expanded_size(document, f"{what}: {path}", max_values)
    return document


def check_expanded_size(document: Any, where: str, max_values: int = MAX_YAML_VALUES) -> None:
    """Raise SettingsError when `document` (as loaded: an alias is one object referenced from several places)
    holds more than `max_values` values once every reference is counted. The walk stops at the bound, so a
    refusal costs at most `max_values` steps and no copy."""
    count, stack = 0, [document]
    while stack:
        value = stack.pop()
        count += 1
        if count > max_values:
            raise SettingsError(
                f"{where}: expands to more than {max_values:,} values (YAML aliases repeated inside "
                "aliases?); write the values out or use fewer nested aliases"
            )
        if isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)


@dataclass(frozen=True)
class Bounds:
    """An accepted numeric range: `gt`/`ge` below, `le` above, any of them absent."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    unit: str = ""

    def describe(self) -> str:
        parts = [
            f"> {self.gt:g}" if self.gt is not None else "",
            f">= {self.ge:g}" if self.ge is not None else "",
            f"<= {self.le:g}" if self.le is not None else "",
        ]
        text = " and ".join(part for part in parts if part)
        return f"{text} {self.unit}".rstrip()

    def admits(self, value: float) -> bool:
        return (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.le is None or value <= self.le)
        )


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    unit: str = "",
    help: str = "",
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A dataclass field whose value (when not None) must lie in the range; `build` enforces it. `help` and
    `choices` are its flag's (cli/config_flags.py derives `kvbench run`'s flags from the config's sections)."""
    metadata = {"bounds": Bounds(gt, ge, le, unit), "help": help, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


def check_bounds(value: Any, bounds: Bounds, where: str) -> None:
    """SettingsError naming `where` and the range unless `value` lies in it; None, and the word a field may take
    instead of a number (`kv_capacity: auto`), have no range."""
    if isinstance(value, (int, float)) and not bounds.admits(value):
        raise SettingsError(f"{where}: must be {bounds.describe()}, got {value!r}")


def build(cls: type[T], values: Mapping[str, Any] | None, where: str) -> T:
    """`cls(**values)` after checking every key exists, simple types match and bounded fields lie in their range;
    `where` prefixes messages."""
    if values is not None and not isinstance(values, Mapping):
        raise SettingsError(f"{where}: expected a mapping (key: value), got {values!r:.80}")
    values = dict(values or {})
    names = [field.name for field in dataclasses.fields(cls) if field.init]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SettingsError(f"{where or 'top level'}: unknown key {key!r}{hint}; valid keys: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    for key, value in list(values.items()):
        values[key] = _coerce(value, hints.get(key), field_path(where, key))
        bounds = fields[key].metadata.get("bounds")
        if bounds is not None:
            check_bounds(values[key], bounds, field_path(where, key))
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{where or 'top level'}: {exc}") from None


def field_path(where: str, key: str) -> str:
    """`section.key`, or `key` at the top level (empty `where`)."""
    return f"{where}.{key}" if where else key


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Accept ints for floats and reject type mistakes (a string where a number belongs, a list where a mapping
    belongs, NaN or infinity where a number belongs)."""
    if hint is None or value is None:
        return value
    options = (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )
    options = tuple(option for option in options if option is not type(None))
    for option in options:
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise SettingsError(f"{where}: expected a finite number, got {value!r}")
            return float(value)
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is bool and isinstance(value, bool):
            return value
        if option is str and isinstance(value, str):
            return value
        if option in (float, int, bool, str):
            continue
        container = _container_kind(option)
        if container is Mapping:
            return _mapping(value, option, where)
        if container is Sequence:
            if isinstance(value, (list, tuple)):
                return value
            continue
        return value  # other types: the dataclass validates them itself
    names = " or ".join(_type_name(option) for option in options)
    raise SettingsError(f"{where}: expected {names}, got {value!r:.80}")


def _container_kind(hint: Any) -> type | None:
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return Mapping
    if isinstance(origin, type) and issubclass(origin, (tuple, list)):
        return Sequence
    return None


def _mapping(value: Any, hint: Any, where: str) -> Mapping:
    """A mapping whose keys and values have the hinted simple types (str keys to str values, say)."""
    if not isinstance(value, Mapping):
        raise SettingsError(f"{where}: expected a mapping (key: value), got {value!r:.80}")
    key_hint, value_hint = typing.get_args(hint) or (Any, Any)
    return {
        _coerce(key, key_hint, f"{where} key"): _coerce(item, value_hint, f"{where}.{key}")
        for key, item in value.items()
    }


def _type_name(hint: Any) -> str:
    container = _container_kind(hint)
    if container is Mapping:
        return "a mapping"
    if container is Sequence:
        return "a list"
    return getattr(hint, "__name__", str(hint))
