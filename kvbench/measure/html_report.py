"""`kvbench report RUN... --format html`: one self-contained HTML file for one or more run folders.

Everything is inside the file: the TTFT CDFs of every point of every folder overlaid, then per folder the
results table, every plot of the folder (its PNGs, base64 data URIs),
the config and environment the run recorded, and the flags summary.md lists (`flags.folder_flags`: invalid
reasons, a warm cache, disagreeing server counters, placeholder answers, the run's notes). No network, no external script or style: it opens
the same from a mail attachment as from the run folder. Formats what the run folder holds; computes nothing.

A short inline script checks that every plot decoded (its natural width) and says so on the page and in
`body[data-plots-loaded]`, so a broken image is visible, not a silent empty box.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kvbench.measure.flags import folder_flags, read_notes
from kvbench.measure.metrics import ttft_values
from kvbench.measure.report import MD_COLUMNS, format_value, md_columns, summary_frame, write_overlay_cdf
from kvbench.measure.run_folder import CONFIG_YAML, ENV_JSON, SUMMARY_JSON, RunEntry, records_by_run

OVERLAY_PNG = "ttft_cdf_all_points.png"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.invalid td { background: #fff0f0; }
.flag { color: #a00; } .warm { color: #a60; }
img.plot { max-width: 48%; margin: 0 1% 1em 0; border: 1px solid #eee; }
div.wide { overflow-x: auto; max-width: 100%; }
pre { background: #f7f7f7; padding: 0.7em; overflow-x: auto; font-size: 12px; }
"""
_CHECK_PLOTS = """
window.addEventListener('load', function () {
  var plots = document.querySelectorAll('img.plot'), loaded = 0;
  plots.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { loaded += 1; }
    else { var note = document.createElement('p'); note.className = 'flag';
           note.textContent = 'plot did not load: ' + img.alt; img.replaceWith(note); }
  });
  document.body.setAttribute('data-plots-loaded', loaded + '/' + plots.length);
});
"""


def report_html(run_dirs: Sequence[Path], entries_by_dir: Sequence[Sequence[RunEntry]]) -> str:
    """The page for `run_dirs`, with each folder's entries (as `kvbench report` read or rebuilt them)."""
    sections = [_section(run_dir, entries) for run_dir, entries in zip(run_dirs, entries_by_dir)]
    title = "kvbench report: " + ", ".join(run_dir.name for run_dir in run_dirs)
    overlay = _overlay(run_dirs, entries_by_dir)
    if len(run_dirs) > 1:
        overlay = _combined(run_dirs, entries_by_dir) + overlay
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n{overlay}{''.join(sections)}"
        f"<script>{_CHECK_PLOTS}</script>\n</body></html>\n"
    )


def _combined(run_dirs: Sequence[Path], entries_by_dir: Sequence[Sequence[RunEntry]]) -> str:
    """One table across the run folders (totals only), each row with its folder first, before the folders' own
    sections."""
    frames = []
    for run_dir, entries in zip(run_dirs, entries_by_dir):
        frame = summary_frame(entries)
        frames.append(frame[frame["tenant"] == "all"].assign(run_dir=run_dir.name))
    frame = pd.concat(frames, ignore_index=True)
    frame = frame[["run_dir", *[column for column in frame.columns if column != "run_dir"]]]
    return f'<section id="all-runs"><h2>All runs</h2>{_table(frame, leading=("run_dir",))}</section>\n'


def _section(run_dir: Path, entries: Sequence[RunEntry]) -> str:
    frame = summary_frame(entries)
    parts = [
        f'<section id="{html.escape(run_dir.name)}"><h2>{html.escape(run_dir.name)}</h2>',
        f"<p>{len(entries)} points; folder <code>{html.escape(str(run_dir))}</code></p>",
        "<h3>Results</h3>",
        _table(frame),
        _flags(entries, read_notes(run_dir / SUMMARY_JSON)),
        "<h3>Plots</h3>",
        _plots(run_dir),
    ]
    for name, title in ((CONFIG_YAML, "Config"), (ENV_JSON, "Environment")):
        path = run_dir / name
        text = path.read_text() if path.exists() else f"({name} is missing)"
        if name == ENV_JSON and path.exists():
            text = json.dumps(json.loads(text), indent=2)
        parts.append(f"<h3>{title}</h3><pre>{html.escape(text)}</pre>")
    parts.append("</section>\n")
    return "\n".join(parts)


def _table(frame: pd.DataFrame, leading: Sequence[str] = ()) -> str:
    columns = [*leading, *(md_columns(frame) if len(frame) else list(MD_COLUMNS))]
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    rows = []
    for _, row in frame.iterrows():
        cells = "".join(_cell(column, row[column]) for column in columns)
        invalid = ' class="invalid"' if row.get("valid") is False else ""
        rows.append(f"<tr{invalid}>{cells}</tr>")
    # A wide table scrolls inside its box instead of running off the page.
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _cell(column: str, value) -> str:
    text = html.escape(format_value(column, value))
    numeric = value is None or isinstance(value, (int, float)) and not isinstance(value, bool)
    return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"


def _flags(entries: Sequence[RunEntry], notes: Sequence[str]) -> str:
    """`flags.folder_flags`, as summary.md and the console list them."""
    items = []
    for flag in folder_flags(entries, notes):
        kind = "flag" if flag.invalid or flag.run_id is None else "warm"
        where = f"<code>{html.escape(flag.run_id)}</code>: " if flag.run_id else ""
        items.append(f'<li class="{kind}">{where}{html.escape(flag.text)}</li>')
    if not items:
        return "<p>No flags: every point is valid, started from a reset cache and agrees with the server.</p>"
    return f"<h3>Flags</h3><ul>{''.join(items)}</ul>"


def _overlay(run_dirs: Sequence[Path], entries_by_dir: Sequence[Sequence[RunEntry]]) -> str:
    """Every point's TTFT CDF of every folder on one axis (identical samples share a curve)."""
    samples = {}
    for run_dir, entries in zip(run_dirs, entries_by_dir):
        records = records_by_run(run_dir)
        for entry in entries:
            values = ttft_values(records.get(entry.run_id, ()))
            if values:
                samples[
                    f"{run_dir.name}: {entry.engine} {entry.load}"
                    if len(run_dirs) > 1
                    else f"{entry.engine} {entry.load}"
                ] = values
    if not samples:
        return ""
    with tempfile.TemporaryDirectory() as folder:
        path = write_overlay_cdf(Path(folder) / OVERLAY_PNG, samples, "TTFT CDF of every point")
        return f"<h2>All points</h2>{_image(path)}\n"


def _image(path: Path) -> str:
    return (
        f'<img class="plot" alt="{html.escape(path.name)}" title="{html.escape(path.name)}" '
        f'src="data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}">'
    )


def _plots(run_dir: Path) -> str:
    images = sorted(run_dir.glob("*.png"))
    if not images:
        return "<p>No plots in this folder.</p>"
    return "".join(_image(path) for path in images)
