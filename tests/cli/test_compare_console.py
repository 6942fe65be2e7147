"""`kvbench compare` prints in kvbench's one console style (cli/console_table.py): its tables never cut a number
at 80-120 columns, and Markdown is what --format md and --out write."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kvbench.cli.commands.compare_cmd import _row_cells, print_comparison
from kvbench.cli.main import main
from kvbench.measure.run_folder import read_run_folder
from kvbench.verdicts.compare import compare

from ..verdicts.test_compare import simple_run


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    return simple_run(root / "base", seed=1), simple_run(root / "new", seed=2, ttft_factor=1.6)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_comparison_tables_never_cut_a_number(folders, width):
    comparison = compare(read_run_folder(folders[0]), read_run_folder(folders[1]))
    buffer = io.StringIO()
    print_comparison(Console(file=buffer, width=width, color_system=None), comparison)
    out = buffer.getvalue()
    assert max(len(line) for line in out.splitlines()) <= width
    assert "Result: 3 regressions" in out  # TTFT p50, p99 and the E2E p50 they lengthen
    assert "…" not in out and "|---" not in out and "**" not in out
    for row in comparison.rows:
        cells = _row_cells(row)
        for name in ("baseline", "new", "delta", "CI"):
            assert cells[name] in out, (name, cells[name])  # whole, on one line


def test_the_cli_prints_tables_and_out_writes_markdown(folders, tmp_path, capsys):
    out_file = tmp_path / "compare.md"
    assert main(["compare", str(folders[0]), str(folders[1]), "--out", str(out_file)]) == 1
    console = capsys.readouterr().out
    assert "Serving metrics" in console and "REGRESSION" in console and "## " not in console
    markdown = out_file.read_text()
    assert markdown.startswith("# kvbench compare") and "**3 regressions**" in markdown and "|--" in markdown
    assert main(["compare", str(folders[0]), str(folders[1]), "--format", "md"]) == 1
    assert capsys.readouterr().out == markdown


def test_at_80_columns_every_verdict_sits_with_its_metric(folders):
    """The columns are stacked (baseline over new, delta over CI), not the rows split into parts: one table per
    section, and each metric's verdict in the metric's own cell (folded under it when the name is long)."""
    comparison = compare(read_run_folder(folders[0]), read_run_folder(folders[1]))
    buffer = io.StringIO()
    print_comparison(Console(file=buffer, width=80, color_system=None), comparison)
    lines = buffer.getvalue().splitlines()
    assert not any("(1/" in line for line in lines)  # no section printed in parts
    assert max(len(line.rstrip()) for line in lines) <= 80
    text = [line.strip() for line in lines]
    for row in comparison.rows:
        if row.kind != "perf":
            continue
        verdict = _row_cells(row)["verdict"]
        starts = [index for index, line in enumerate(text) if line.startswith(f"{row.metric}:")]
        assert starts, row.metric
        assert all(verdict in " ".join(text[index : index + 2]) for index in starts), (row.metric, verdict)
