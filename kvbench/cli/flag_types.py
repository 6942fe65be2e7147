"""Argparse value types with ranges, so a bad flag fails at parse time with the flag, the range and the value.

`type=at_least(1)` instead of `type=int`: `kvbench run --num-requests 0` then stops with
`kvbench run: error: argument --num-requests: must be an integer >= 1, got '0'` before anything starts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (`prog: error: message (see prog --help)`), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer flag >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def number_above(bound: float, inclusive: bool = False) -> Callable[[str], float]:
    """A finite float flag > `bound` (>= with `inclusive`)."""

    def parse(text: str) -> float:
        value = _number(text)
        if not math.isfinite(value) or value < bound or (value == bound and not inclusive):
            raise argparse.ArgumentTypeError(f"must be a number {'>=' if inclusive else '>'} {bound:g}, got {text!r}")
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


def _number(text: str) -> float:
    """The float of a flag's text; NaN (refused by every range) when it is not a number."""
    try:
        return float(text)
    except ValueError:
        return math.nan
