"""benchmarks/sim_validate_published.py: the targets table rebuilt from written comparison.json files."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from kvbench.cli.main import main as kvbench_main
from tests.sim.test_published_case import V2, write

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_validate_published.py"


def load_script():
    spec = importlib.util.spec_from_file_location("sim_validate_published", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_from_comparisons_rebuilds_the_table_from_the_json_alone(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert kvbench_main(["validate-published", str(write(tmp_path, V2)), "--out", str(out)]) == 0
    doc = json.loads((out / "comparison.json").read_text())
    script = load_script()
    lines, effects = script.from_comparison(out)
    assert [line.split(" | ")[1] for line in lines] == ["baseline", "offload"]
    for line, arm in zip(lines, ("baseline", "offload")):
        cell = doc["arms"][arm]["total_tok_s"]
        ratio = cell["simulated"] / cell["published"]
        assert f"= {ratio:.2f}" in line
        assert ("| met |" in line) == (0.8 <= ratio <= 1.2)
    (effect,) = doc["effects"]
    assert effects == [
        f"| tiny-v2 | offload over baseline | whole | total_tok_s | {effect['published_change'] * 100:+.1f}% | "
        f"{effect['simulated_change'] * 100:+.1f}% | {effects[0].rsplit(' | ', 1)[1]}"
    ]
    # The command line: no --fit needed, the table written where --out says.
    table = tmp_path / "targets.md"
    monkeypatch.setattr(sys, "argv", ["x", "--from-comparisons", str(out), "--out", str(table)])
    script.main()
    text = table.read_text()
    assert lines[0] in text and lines[1] in text and effects[0] in text


def test_a_folder_without_a_comparison_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no comparison.json there"):
        load_script().from_comparison(tmp_path)
