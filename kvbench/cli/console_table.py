"""kvbench's one console table style: numbers are never cut, whatever the terminal's width.

A table is given as rows of already formatted cells. Each number column is as wide as its widest cell and
its title when the whole table fits so, else as its widest cell (its title wraps onto more lines instead); a label column (engine, workload, ...) is at most
`LABEL_WIDTH` wide and folds a longer label onto a second line rather than cutting it. When the columns do
not fit the console, the table is printed in parts, each repeating the key columns (the first `keys`), so
that every number stays beside the row it belongs to. rich would otherwise shrink every column and end the
numbers in '...'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

LABEL_WIDTH = 24
_BORDER = 1  # the table's left edge
_PER_COLUMN = 3  # one space either side, one separator


@dataclass(frozen=True)
class Column:
    title: str
    numeric: bool  # right-aligned and never cut; labels fold


def print_table(
    console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]], keys: int = 1, title: str | None = None
) -> None:
    """Print `rows` (cells already formatted; rich markup escaped) under `columns`, in as many parts as the
    console's width needs, each part with the first `keys` columns."""
    cells = [[row[index] for row in rows] for index in range(len(columns))]
    widths = [_width(column, cells[index], whole_title=True) for index, column in enumerate(columns)]
    parts = _parts(widths, keys, console.width)
    if len(parts) > 1:  # titles on one line do not fit: wrap them to their words
        widths = [_width(column, cells[index], whole_title=False) for index, column in enumerate(columns)]
        parts = _parts(widths, keys, console.width)
    for number, part in enumerate(parts, 1):
        suffix = f" ({number}/{len(parts)})" if len(parts) > 1 else ""
        table = Table(
            title=f"{title or ''}{suffix}".strip() or None,
            box=box.SIMPLE_HEAD,
            title_justify="left",
            pad_edge=True,
            collapse_padding=False,
        )
        for index in part:
            column = columns[index]
            table.add_column(
                column.title, justify="right" if column.numeric else "left", width=widths[index], overflow="fold"
            )  # a number fits its width; a title or a long label wraps
        for row in rows:
            table.add_row(*[row[index] for index in part])
        console.print(table)


def fits(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]], keys: int = 1) -> bool:
    """Whether `print_table` prints the rows as one table at the console's width (no parts)."""
    cells = [[row[index] for row in rows] for index in range(len(columns))]
    widths = [_width(column, cells[index], whole_title=False) for index, column in enumerate(columns)]
    return len(_parts(widths, keys, console.width)) == 1


def _width(column: Column, cells: Sequence[str], whole_title: bool) -> int:
    """A number column: its widest cell and its title (`whole_title`) or the title's longest word; a label:
    that, up to LABEL_WIDTH. A cell or title of several lines (stacked values) counts its longest line."""
    widest = max((len(line) for cell in cells for line in cell.split("\n")), default=0)
    title_word = (
        max(len(line) for line in column.title.split("\n"))
        if whole_title
        else max((len(word) for word in column.title.split()), default=1)
    )
    if column.numeric:
        return max(widest, title_word)
    return max(min(widest, LABEL_WIDTH), min(title_word, LABEL_WIDTH), 1)


def _parts(widths: Sequence[int], keys: int, total: int) -> list[list[int]]:
    """Column indices per part: the key columns, then as many of the rest as fit `total` columns (one at
    least, even if it does not)."""
    key_columns = list(range(min(keys, len(widths))))
    base = _BORDER + sum(widths[index] + _PER_COLUMN for index in key_columns)
    parts: list[list[int]] = []
    current: list[int] = []
    used = base
    for index in range(len(key_columns), len(widths)):
        need = widths[index] + _PER_COLUMN
        if current and used + need > total:
            parts.append(key_columns + current)
            current, used = [], base
        current.append(index)
        used += need
    if current or not parts:
        parts.append(key_columns + current)
    return parts
