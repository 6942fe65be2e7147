"""kvbench's console tables never cut a number, at 80, 120 or 200 columns: the table is printed in parts
that repeat the row's label instead, and labels fold rather than end in '...'."""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest
from rich.console import Console

from kvbench.cli.tables import SUMMARY_COLUMNS, _fmt, print_frame
from kvbench.measure.report import COLUMNS, EXTRA_COLUMNS


def _main_job_frame() -> pd.DataFrame:
    """The main job's two rows with the wide numbers that were cut at 120 columns (7396..., 18514...)."""
    rows = []
    for label, dtype, ttft in (("kvengine-fp32", "fp32", 18514.23), ("kvengine-fp8_e4m3", "fp8_e4m3/tensor", 7396.41)):
        row = {column: None for column in COLUMNS + EXTRA_COLUMNS}
        row.update(
            engine=label,
            kv_dtype=dtype,
            workload="rag-chat-mini",
            load="conc=4",
            tenant="all",
            requests=40,
            errors=0,
            ttft_p50_ms=ttft,
            ttft_p99_ms=ttft * 2.2,
            ttft_from_schedule_p99_ms=ttft * 2.21,
            itl_p50_ms=191.87,
            output_tok_s=3.9,
            cache_hit_rate=0.399,
            oracle_hit_rate=0.823,
            prefill_recompute_rate=0.516,
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)


def _render(frame, width) -> str:
    out = io.StringIO()
    print_frame(Console(file=out, width=width, color_system=None), frame, SUMMARY_COLUMNS)
    return out.getvalue()


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_every_number_and_label_is_whole_at_any_width(width):
    frame = _main_job_frame()
    text = _render(frame, width)
    assert "…" not in text and "..." not in text
    assert max(len(line) for line in text.splitlines()) <= width
    cells = re.split(r"\s+", text)
    for _, row in frame.iterrows():
        for column in SUMMARY_COLUMNS:
            assert _fmt(column, row[column]) in cells, (column, _fmt(column, row[column]))
    parts = text.count("kvengine-fp8_e4m3")
    assert parts >= 1 and text.count("kvengine-fp32") == parts  # the label heads every part of the table


def test_a_wide_console_prints_one_part_a_narrow_one_several():
    assert "(1/" not in _render(_main_job_frame(), 200)
    assert "(1/2)" in _render(_main_job_frame(), 80) or "(1/3)" in _render(_main_job_frame(), 80)


def test_a_label_longer_than_the_label_width_folds_instead_of_ending_in_dots():
    frame = _main_job_frame()
    frame.loc[0, "engine"] = "vllm[kv_cache_dtype=fp8_e4m3,block_size=16,prefix=on]"
    text = _render(frame, 120)
    assert "…" not in text
    assert "vllm[kv_cache_dtype=fp8" in text.replace("\n", " ")


def test_eval_prints_its_summary_in_the_same_style_with_every_number(tmp_path, monkeypatch):
    from kvbench.cli.commands import eval_cmd
    from kvbench.measure.run_folder import EVAL_MD, EVAL_SUMMARY_CSV

    pd.DataFrame(
        {
            "setting": ["fp16", "fp8_e4m3/tensor"],
            "kl": [0.0, 1.234e-4],
            "top1_agreement": [1.0, 0.9871],
            "ppl_delta_pct": [0.0, -0.4312],
            "items": [512, 512],
        }
    ).to_csv(tmp_path / EVAL_SUMMARY_CSV, index=False)
    out = io.StringIO()
    monkeypatch.setattr(eval_cmd, "console", Console(file=out, width=80, color_system=None))
    eval_cmd.print_eval_summary({EVAL_SUMMARY_CSV: tmp_path / EVAL_SUMMARY_CSV, EVAL_MD: tmp_path / EVAL_MD})
    text = out.getvalue()
    cells = re.split(r"\s+", text)
    for cell in ("1.23e-04", "98.7%", "-0.43%", "512", "fp8_e4m3/tensor"):
        assert cell in cells, cell
    assert "|" not in text and "…" not in text  # not Markdown, nothing cut


def test_off_a_terminal_tables_take_columns_from_the_environment(monkeypatch):
    from kvbench.cli.tables import wide_console

    monkeypatch.setenv("COLUMNS", "80")
    assert wide_console().width == 80
    monkeypatch.delenv("COLUMNS")
    assert wide_console().width == 200  # a pipe without COLUMNS: wide, so that no cell is cut
