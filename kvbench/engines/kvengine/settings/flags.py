"""Command-line flags made from a settings dataclass (`config.py`): one flag per field, its argv, and back.

    add_flags(parser, EngineConfig)          --kv-capacity N, --prefix-caching / --no-prefix-caching, ...
    from_args(EngineConfig, namespace)       the dataclass again, ranges and choices checked (`settings.build`)
    to_argv(config)                          the flags of every field that differs from its default

A field's flag is its name with dashes (a field declared `flag=False`, a secret, has none); help, unit and choices come from the field (`config.setting`). Bools
are --x / --no-x, an Optional field (default None) takes a value or is left out, a tuple[str, ...] field takes
several values. `from_args(cls, parser.parse_args(to_argv(config))) == config` for every config.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Collection
from enum import Enum
from typing import Any, TypeVar

from kvbench.engines.kvengine.settings.config import choices_of
from kvbench.settings import build

T = TypeVar("T")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base(hint: Any) -> Any:
    """The type of a field without its `| None`."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def _is_tuple(base: Any) -> bool:
    return typing.get_origin(base) is tuple


def _words(hint: Any) -> tuple[str, ...]:
    """The words a number field also takes (`int | Literal["auto"]`: auto)."""
    return tuple(
        word
        for arg in typing.get_args(hint)
        if typing.get_origin(arg) is typing.Literal
        for word in typing.get_args(arg)
    )


def _number_or(base: type, words: tuple[str, ...]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return text if text in words else base(text)

    parse.__name__ = f"{base.__name__} or {' or '.join(words)}"  # argparse names it in "invalid ... value"
    return parse


def _init_fields(cls: type, only: Collection[str] | None = None) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [
        (f, _base(hints[f.name]))
        for f in dataclasses.fields(cls)
        if f.init and f.metadata.get("flag", True) and (only is None or f.name in only)
    ]


def _hint(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, only: Collection[str] | None = None
) -> None:
    """One flag per init field of `cls` (or per field named in `only`, for a command that sets a few)."""
    for f, base in _init_fields(cls, only):
        help_text = f.metadata.get("help", "").replace("%", "%%")  # a setting's help is plain text, not a format
        help_text += " (default: %(default)s)" if f.default not in (None, ()) else ""
        if base is bool:
            parser.add_argument(
                flag_of(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
            )
            continue
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "metavar": _metavar(f)}
        if _is_tuple(base):
            kwargs.update(nargs="*", type=str)
        elif words := _words(_hint(cls, f.name)):
            kwargs["type"] = _number_or(base, words)
        else:
            kwargs["type"] = str if isinstance(base, type) and issubclass(base, (Enum, str)) else base
            kwargs["choices"] = choices_of(f, base)
        parser.add_argument(flag_of(f.name), help=help_text, **kwargs)


def _metavar(f: dataclasses.Field) -> str | None:
    """The unit as the value's name (`--kv-capacity TOKENS`); argparse's own choice (the choices, or the
    flag's name) without one."""
    bounds = f.metadata.get("bounds")
    unit = bounds.unit if bounds is not None else ""
    return {"s": "SECONDS"}.get(unit, unit.upper()) or None


def from_args(cls: type[T], args: argparse.Namespace, only: Collection[str] | None = None) -> T:
    """The `cls` that parsed flags (`add_flags` with the same `only`) describe, the other fields at their
    defaults; SettingsError for a value out of range."""
    values = {}
    for f, base in _init_fields(cls, only):
        value = getattr(args, f.name)
        values[f.name] = tuple(value) if _is_tuple(base) else value
    return build(cls, values, "")


def to_argv(config: object) -> list[str]:
    """The flags that make `from_args` return `config`: one per field whose value is not its default."""
    argv: list[str] = []
    for f, base in _init_fields(type(config)):
        value = getattr(config, f.name)
        if value == f.default:
            continue
        flag = flag_of(f.name)
        if base is bool:
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is None:
            raise ValueError(f"{f.name}: None cannot be written as a flag (its default is {f.default!r})")
        elif _is_tuple(base):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value.value if isinstance(value, Enum) else value)]
    return argv
