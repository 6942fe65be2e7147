"""`kvbench run`'s flags made from the experiment config's sections (harness/config.py), as `kvbench serve`'s are
made from EngineConfig (engines/kvengine/settings/flags.py): one flag per field a section exposes, its help, unit,
range and choices from the field.

    add_flags(parser)        --num-requests N, --duration SECONDS, --api {completions,chat}, --seed N, ...
    given(args)              {"stop": {"num_requests": 20}, "": {"seed": 3}}: the sections' fields the flags set

A flag is the field's name with dashes unless SECTIONS renames it (`duration_s` is `--duration`); its dest is
the field's name. Every flag defaults to None, so a flag left out leaves CONFIG.yaml's value (or the field's
default) in place; the range is checked as the flag is parsed, with the flag's name in the error.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.cli.flag_types import at_least, number_above
from kvbench.engines.kvengine.settings.flags import _base, flag_of
from kvbench.harness.config import ClientSpec, StopSpec, TopScalars
from kvbench.measure.metrics import SLO


@dataclass(frozen=True)
class Section:
    """A config section (`key` in the config mapping; "" for the top level) and the fields that are flags: field
    -> its flags (empty: the field's name with dashes). `exclusive`: fields of which one flag at most is given."""

    key: str
    cls: type
    fields: Mapping[str, tuple[str, ...]]
    exclusive: tuple[str, ...] = ()
    title: str = ""


SECTIONS = (
    Section(
        "stop",
        StopSpec,
        {
            "num_requests": ("--num-requests", "--num-prompts"),
            "duration_s": ("--duration",),
            "warmup_requests": ("--warmup",),
        },
        exclusive=("num_requests", "duration_s"),
    ),
    Section("client", ClientSpec, {"api": (), "tokenizer": (), "ignore_eos": (), "max_lag_ms": (), "workers": ()}),
    Section("slo", SLO, {"ttft_ms": ("--slo-ttft-ms",), "tpot_ms": ("--slo-tpot-ms",), "e2e_ms": ("--slo-e2el-ms",)}),
    Section("", TopScalars, {"seed": (), "repeat": ()}),
)


def add_flags(parser: argparse.ArgumentParser, sections: tuple[Section, ...] = SECTIONS) -> None:
    """One flag per exposed field of every section."""
    for section in sections:
        group = parser.add_mutually_exclusive_group() if section.exclusive else None
        hints = typing.get_type_hints(section.cls)
        for f in dataclasses.fields(section.cls):
            if f.name not in section.fields:
                continue
            target = group if f.name in section.exclusive else parser
            names = section.fields[f.name] or (flag_of(f.name),)
            target.add_argument(*names, dest=f.name, default=None, help=_help(f), **_value_kwargs(f, hints[f.name]))


def given(args: argparse.Namespace, sections: tuple[Section, ...] = SECTIONS) -> dict[str, dict[str, Any]]:
    """Section key -> {field: value} for every flag given (a flag left out is not there)."""
    values: dict[str, dict[str, Any]] = {}
    for section in sections:
        for name in section.fields:
            if getattr(args, name) is not None:
                values.setdefault(section.key, {})[name] = getattr(args, name)
    return values


def _help(f: dataclasses.Field) -> str:
    text = f.metadata.get("help", "").replace("%", "%%")  # a field's help is plain text, not a format
    bounds = f.metadata.get("bounds")
    unit = f" {bounds.unit}" if bounds is not None and bounds.unit not in ("", "s") else ""
    if f.default not in (None, dataclasses.MISSING):
        default = f.default if not isinstance(f.default, bool) else ("on" if f.default else "off")
        text += f" (default {default}{unit})"
    return text


def _value_kwargs(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """argparse's action/type/choices/metavar for the field's type and range."""
    base = _base(hint)
    if base is bool:
        return {"action": argparse.BooleanOptionalAction}
    bounds = f.metadata.get("bounds")
    unit = bounds.unit if bounds is not None else ""
    kwargs: dict[str, Any] = {"type": _ranged(base, bounds)}
    if f.metadata.get("choices"):
        kwargs["choices"] = f.metadata["choices"]
    elif base is not str:
        kwargs["metavar"] = {"s": "SECONDS", "": "N"}.get(unit, unit.upper())
    return kwargs


def _ranged(base: type, bounds) -> Callable[[str], Any]:
    """The argparse type that checks the field's range as the flag is parsed."""
    low = None if bounds is None else bounds.ge if bounds.ge is not None else bounds.gt
    if base is int and low is not None:
        return at_least(int(low) + (bounds.ge is None), None if bounds.le is None else int(bounds.le))
    if base is float and low is not None:
        return number_above(low, inclusive=bounds.ge is not None, maximum=bounds.le)
    return base
