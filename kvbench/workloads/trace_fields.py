"""The fields of a trace file, read one way for every trace format (`traces.py`, `kvbench_jsonl.py`): JSON lines
and text errors, integer and number fields with their bounds, the readers' common options. A missing or
invalid field raises `TraceFormatError` with the message `file:line: field 'x' ...`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from kvbench.workloads.spec import TOKEN_DTYPE, WorkloadError, token_array
from kvbench.workloads.tokens import MAX_TOKENS_PER_FIELD

NO_TOKENS = token_array(np.zeros(0, dtype=TOKEN_DTYPE))  # a turn or context that adds none


class TraceFormatError(WorkloadError):
    """A trace row that cannot be read; the message starts with `file:line:`."""


def json_lines(path: str | Path, limit: int | None) -> Iterator[tuple[str, dict]]:
    """(`file:line`, object) for each non-blank line, up to `limit` objects."""
    count = 0
    with open(path, encoding="utf-8") as file, text_errors(path):
        for number, line in enumerate(file, start=1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise TraceFormatError(f"{where}: not a JSON object ({error.msg})") from None
            if not isinstance(row, dict):
                raise TraceFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
            count += 1
            yield where, row


@contextmanager
def text_errors(path: str | Path) -> Iterator[None]:
    """A binary or non-UTF-8 file, or a CSV with NUL bytes, as a TraceFormatError naming the file."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise TraceFormatError(
            f"{path}: not a UTF-8 text trace (byte {error.start}: {error.reason}); "
            "expected Mooncake/kvbench JSONL or Azure CSV"
        ) from None
    except csv.Error as error:
        raise TraceFormatError(f"{path}: not a CSV trace ({error})") from None


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer_field(row: dict, name: str, where: str, minimum: int, parse: bool = False) -> int:
    """An integer field in [minimum, MAX_TOKENS_PER_FIELD]."""
    if name not in row:
        raise TraceFormatError(f"{where}: field '{name}' is missing")
    value = row[name]
    if parse:
        try:
            value = int(value)
        except ValueError:
            raise TraceFormatError(f"{where}: field '{name}' must be an integer, got {row[name]!r:.40}") from None
    if not is_int(value) or not minimum <= value <= MAX_TOKENS_PER_FIELD:
        raise TraceFormatError(
            f"{where}: field '{name}' must be an integer from {minimum} to {MAX_TOKENS_PER_FIELD:,} "
            f"(trace lengths are capped there), got {row[name]!r:.40}"
        )
    return value


def number_field(row: dict, name: str, where: str, minimum: float, default: float | None = None) -> float:
    if name not in row:
        if default is not None:
            return default
        raise TraceFormatError(f"{where}: field '{name}' is missing")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise TraceFormatError(f"{where}: field '{name}' must be a number >= {minimum}, got {value!r}")
    return float(value)


def wall_clock_ns(text: str, where: str) -> int:
    """Nanoseconds since the epoch (as UTC) of `YYYY-MM-DD HH:MM:SS[.fraction]`, fraction digits kept."""
    whole, _, fraction = text.strip().partition(".")
    try:
        seconds = int(datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp())
        if fraction and not fraction.isdigit():
            raise ValueError(fraction)
        return seconds * 10**9 + int((fraction or "0")[:9].ljust(9, "0"))
    except ValueError:
        raise TraceFormatError(
            f"{where}: field 'TIMESTAMP' must look like 2023-11-16 18:15:46.6805900, got {text!r}"
        ) from None


def check_options(time_scale: float, limit: int | None) -> None:
    if not time_scale > 0:
        raise WorkloadError(f"time_scale must be > 0 (it multiplies inter-arrival times), got {time_scale}")
    if limit is not None and (not is_int(limit) or limit < 1):
        raise WorkloadError(f"limit must be an int >= 1 (rows to keep) or None, got {limit!r}")
