"""Strict settings: a mapping from YAML or flags into a frozen dataclass, naming every unknown key and bad value."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """Bad user input; the message names the field, what is wrong and the valid choices."""


def build(cls: type[T], values: Mapping[str, Any] | None, where: str) -> T:
    """`cls(**values)` after checking every key exists and simple types match; `where` prefixes messages."""
    values = dict(values or {})
    names = [field.name for field in dataclasses.fields(cls) if field.init]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SettingsError(f"{where}: unknown key {key!r}{hint}; valid keys: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    for key, value in list(values.items()):
        values[key] = _coerce(value, hints.get(key), f"{where}.{key}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Accept ints for floats and reject obvious type mistakes (a string where a number belongs)."""
    if hint is None or value is None:
        return value
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union else (hint,)
    for option in options:
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is bool and isinstance(value, bool):
            return value
        if option is str and isinstance(value, str):
            return value
        if option in (float, int, bool, str):
            continue
        return value  # containers and other types: the dataclass validates them itself
    names = " or ".join(getattr(option, "__name__", str(option)) for option in options)
    raise SettingsError(f"{where}: expected {names}, got {value!r}")
