"""`kvbench report` on every folder kvbench writes: a `--find-max` search (find_max.json and probes/NN-<load>/, one
run folder per probe) is a row per probe, in probe order; a folder with no run in it is still one clear error."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from kvbench.cli.main import main
from kvbench.measure.metrics import SLO
from kvbench.measure.records import PointId
from kvbench.measure.report import write_summaries
from kvbench.measure.run_folder import RunEntry

from .test_vllm_flags import _record


def _search(tmp_path):
    search = tmp_path / "search"
    for number, concurrency in ((1, 1), (2, 2), (3, 4)):
        probe = search / "probes" / f"{number:02d}-concurrency-{concurrency}"
        probe.mkdir(parents=True)
        records = [_record(i, 10 * concurrency) for i in range(4)]
        write_summaries(probe, [RunEntry.of(PointId("ours", "w", f"conc={concurrency}", 0), records, SLO())])
    (search / "find_max.json").write_text(json.dumps({"answer": 2, "missed_at": 4}))
    return search


def test_a_find_max_folder_is_a_row_per_probe(tmp_path, capsys):
    assert main(["report", str(_search(tmp_path)), "--format", "csv"]) == 0
    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(table.run_dir) == ["search/01-concurrency-1", "search/02-concurrency-2", "search/03-concurrency-4"]
    assert list(table.load) == ["conc=1", "conc=2", "conc=4"]
    assert list(table.ttft_p50_ms) == [10.0, 20.0, 40.0]


def test_a_folder_without_runs_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no summary.json and no requests.jsonl" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("fmt", ["table", "html"])
def test_every_format_reads_the_probes(tmp_path, capsys, fmt):
    out = tmp_path / "r.html"
    assert main(["report", str(_search(tmp_path)), "--format", fmt, "--out", str(out)]) == 0
    text = out.read_text() if fmt == "html" else capsys.readouterr().out
    assert all(f"concurrency-{n}" in text for n in (1, 2, 4))


def test_the_html_report_of_several_runs_has_one_table_across_them(tmp_path):
    search = _search(tmp_path)
    probes = sorted((search / "probes").iterdir())
    out = tmp_path / "r.html"
    assert main(["report", *map(str, probes[:2]), "--format", "html", "--out", str(out)]) == 0
    page = out.read_text()
    combined = page[page.index('<section id="all-runs">') : page.index("</section>")]
    assert combined.count("<tr>") + combined.count('<tr class="invalid">') == 3  # the head and a row per run
    assert "01-concurrency-1" in combined and "02-concurrency-2" in combined
    assert page.index('id="all-runs"') < page.index('id="01-concurrency-1"')  # before the runs' own sections
