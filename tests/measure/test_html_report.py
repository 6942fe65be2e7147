"""`kvbench report --format html` opened in headless Chromium: it renders, every plot of every folder decodes,
the config, environment, invalid reasons and warm-cache flags are on the page, and the console has no error."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kvbench.cli.main import main

from ..harness.instrument_fixture import instrument_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (ci/test.sh installs it)"
)


def open_in_chromium(path, tmp_path):
    """(DOM after load, console error lines) of `path` in headless Chromium."""
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            path.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    return done.stdout, errors


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two run folders on the instrument, one valid (no cache reset: a warm-cache point) and one whose every
    request fails (invalid), in one HTML report."""
    root = tmp_path_factory.mktemp("html")
    with instrument_process("--served-model", "instrument") as (url, _):
        # (--max-lag-ms: a busy machine's client lag is not this test's subject; past it the point is invalid)
        assert (
            main(["run", "--url", url, "--num-sessions", "3", "--max-lag-ms", "1000", "--out", str(root / "good")]) == 0
        )
    # Every request answered 500 (a wrong --model no longer sends any: the endpoint preflight refuses it first).
    with instrument_process("--served-model", "instrument", "--fault", "http_500") as (url, _):
        assert main(["run", "--url", url, "--num-sessions", "2", "--out", str(root / "bad")]) == 1
    out = root / "report.html"
    assert main(["report", str(root / "good"), str(root / "bad"), "--format", "html", "--out", str(out)]) == 0
    return root, out


def test_the_report_is_one_file_that_needs_nothing_else(report):
    _, out = report
    text = out.read_text()
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", text)  # no file, no URL: data URIs only
    # the overlaid CDF of every point, then ttft_cdf.png and throughput_vs_ttft_p99.png of each folder
    assert text.count('class="plot"') == 5 and "ttft_cdf_all_points.png" in text


@needs_chromium
def test_chromium_renders_every_plot_and_no_console_error(report, tmp_path):
    root, out = report
    dom, errors = open_in_chromium(out, tmp_path)
    assert errors == []
    assert 'data-plots-loaded="5/5"' in dom
    assert dom.count("<table>") == 3 and "kvbench report: good, bad" in dom  # the combined table, then one per folder
    assert "INVALID: 2/2 requests failed" in dom and "warm cache" in dom
    assert "workloads:" in dom and "rag-chat-mini" in dom  # config.yaml
    assert '"cpu_count":' in dom and '"packages":' in dom  # env.json


@needs_chromium
def test_a_broken_plot_and_a_script_error_are_caught(tmp_path):
    """The checks above can fail: a page whose image does not decode and whose script throws."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><img class="plot" alt="x.png" src="data:image/png;base64,AAAA">'
        "<script>throw new Error('boom')</script></body></html>"
    )
    _, errors = open_in_chromium(page, tmp_path)
    assert any("boom" in line for line in errors)
