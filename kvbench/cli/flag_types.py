"""Argparse value types with ranges, so a bad flag fails at parse time with the flag, the range and the value.

`type=at_least(1)` instead of `type=int`: `kvbench run --num-requests 0` then stops with
`kvbench run: error: argument --num-requests: must be an integer >= 1, got '0'` before anything starts.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Callable, Sequence

UNRECOGNIZED = "unrecognized arguments: "


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (`prog: error: message (see prog --help)`), exit 2, and
    that names the closest flag of the command for an unknown one (`--request-rat`: did you mean
    --request-rate?); Python's own argparse suggests only from 3.14 on."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        if message.startswith(UNRECOGNIZED):
            message += self._suggestions(message[len(UNRECOGNIZED) :].split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _suggestions(self, unknown: list[str]) -> str:
        """`; did you mean X?` for each unknown flag with a close one in the command it was given to."""
        flags = _flags(self._command() or self)
        hints = []
        for word in unknown:
            name = word.split("=", 1)[0]
            close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6) if name.startswith("-") else []
            if close:
                hints.append(f"{name}: did you mean {close[0]}?")
        return f"; {'; '.join(hints)}" if hints else ""

    def _command(self) -> argparse.ArgumentParser | None:
        """The subcommand's parser named in the arguments parsed last, if any."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word in getattr(self, "_argv", []):
                    if word in action.choices:
                        return action.choices[word]
        return None


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]


def at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An integer flag >= `minimum` (and <= `maximum`, when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 30 else None  # int() of a 10^6-digit text takes seconds
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            wanted = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
            raise argparse.ArgumentTypeError(f"must be an integer {wanted}, got {_cut(text)}")
        return value

    return parse


def number_above(bound: float, inclusive: bool = False, maximum: float | None = None) -> Callable[[str], float]:
    """A finite float flag > `bound` (>= with `inclusive`), and <= `maximum` when given."""

    def parse(text: str) -> float:
        value = _number(text)
        if (
            not math.isfinite(value)
            or value < bound
            or (value == bound and not inclusive)
            or (maximum is not None and value > maximum)
        ):
            wanted = f"{'>=' if inclusive else '>'} {bound:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
            raise argparse.ArgumentTypeError(f"must be a number {wanted}, got {_cut(text)}")
        return value

    return parse


def number_between(low: float, high: float) -> Callable[[str], float]:
    """A finite float flag strictly between `low` and `high`."""

    def parse(text: str) -> float:
        value = _number(text)
        if not low < value < high:
            raise argparse.ArgumentTypeError(f"must be a number between {low:g} and {high:g}, got {text!r}")
        return value

    return parse


def _cut(text: str) -> str:
    """A flag's text as an error quotes it: cut past 40 characters."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _number(text: str) -> float:
    """The float of a flag's text; NaN (refused by every range) when it is not a number."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def checked_by(parse: Callable[[str], object]) -> Callable[[str], str]:
    """A flag whose text `parse` must accept (its ValueError is the flag's error), kept as the text: e.g. the
    stages of `kvbench run --stages`, which its config's load point holds as written."""

    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text.strip()

    return check
