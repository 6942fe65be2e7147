"""A point's flags have one owner (measure/flags.py): summary.json holds them, and summary.md, the console and
the HTML report list the same ones, so no output says "no flags" while another lists some."""

from __future__ import annotations

import html
import json
import re

from rich.console import Console

from kvbench.cli.tables import print_flags
from kvbench.measure.flags import folder_flags
from kvbench.measure.html_report import report_html
from kvbench.measure.metrics import SLO
from kvbench.measure.records import PointId
from kvbench.measure.report import write_summaries
from kvbench.measure.run_folder import SUMMARY_JSON, SUMMARY_MD, RunEntry, read_entries

NOTES = ("requests_metrics / vllm exports not written: OSError: disk full",)


def _entries() -> list[RunEntry]:
    def point(load: str, **known) -> RunEntry:
        return RunEntry.of(PointId("e", "w", load, 0), [], SLO(), **known)

    return [
        point("c1"),  # clean: no flag
        point("c2", invalid_reasons=["client lag: 30 ms over the 10 ms bound"]),
        point("c3", cache_reset=False),
        point("c4", reconciliation={"agree": False, "detail": "client 10 cached, server 0"}),
    ]


def _said(run_id: str | None, text: str) -> str:
    return f"{run_id}: {text}" if run_id else text


def test_summary_md_console_and_html_list_the_flags_summary_json_holds(tmp_path):
    entries = _entries()
    write_summaries(tmp_path, entries, NOTES)
    flags = folder_flags(entries, NOTES)
    assert [flag.run_id for flag in flags] == ["e|w|c2|r0", "e|w|c3|r0", "e|w|c4|r0", None]  # c1 has none
    expected = [_said(flag.run_id, flag.text) for flag in flags]

    stored = json.loads((tmp_path / SUMMARY_JSON).read_text())
    held = [_said(run["run_id"], text) for run in stored["runs"] for text in run["flags"]] + stored["notes"]
    assert held == expected

    md = (tmp_path / SUMMARY_MD).read_text().split("## Flags", 1)[1].strip().splitlines()
    assert [line.removeprefix("- ").replace("`", "") for line in md] == expected

    console = Console(record=True, width=400)
    print_flags(console, tmp_path)
    assert [line.removeprefix("flag: ") for line in console.export_text().splitlines()] == expected

    page = report_html([tmp_path], [read_entries(tmp_path)])
    items = re.findall(r"<li[^>]*>(.*?)</li>", page)
    assert [html.unescape(re.sub(r"<[^>]+>", "", item)) for item in items] == expected
    assert "No flags" not in page


def test_a_clean_folder_has_no_flags_anywhere(tmp_path):
    write_summaries(tmp_path, _entries()[:1])
    assert "## Flags" not in (tmp_path / SUMMARY_MD).read_text()
    console = Console(record=True, width=400)
    assert print_flags(console, tmp_path) == [] and console.export_text() == ""
    assert "No flags" in report_html([tmp_path], [read_entries(tmp_path)])
