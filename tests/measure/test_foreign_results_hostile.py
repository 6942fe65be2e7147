"""Any JSON in any field of another tool's result file is read or refused in one line (issue 46): before, a
vLLM file nested 100,000 deep, an AIPerf `unit: ["ms"]` and a guidellm `request_totals: "x"` were
RecursionError / TypeError / AttributeError tracebacks, and a 5 MB label or 100,000 benchmarks took minutes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.measure.foreign_columns import MAX_GUIDELLM_BENCHMARKS, MAX_LABEL_CHARS
from kvbench.measure.foreign_results import (
    ForeignResultError,
    foreign_rows,
    read_foreign,
)

from .test_foreign_results import AIPERF, GUIDELLM, VLLM

FILES = {"vllm": VLLM, "aiperf": AIPERF, "guidellm": GUIDELLM}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def paths(node, prefix=()):
    """Every path to a value in a decoded JSON document."""
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from paths(child, (*prefix, key))


def replaced(document, path, value):
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


def read_or_refused(data, tmp_path) -> None:
    """Rows of dicts, or a ForeignResultError of one line, by both doors (decoded JSON, and the file)."""
    file = tmp_path / "result.json"
    file.write_text(json.dumps(data))
    for read in (lambda: foreign_rows(data, "x", "x.json"), lambda: read_foreign(file)):
        try:
            rows = read()
        except ForeignResultError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 600
        else:
            assert rows and all(isinstance(row, dict) and isinstance(row["engine"], str) for row in rows)


@pytest.mark.parametrize("tool", FILES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=JSON_VALUES)
def test_any_json_value_in_any_field_is_read_or_refused_in_one_line(tool, tmp_path, data, value):
    document = json.loads(FILES[tool].read_text())
    path = data.draw(st.sampled_from(list(paths(document))))
    read_or_refused(replaced(document, path, value), tmp_path)


@pytest.mark.parametrize(
    "tool, path, value, expected",
    [
        (
            "aiperf",
            ("time_to_first_token", "unit"),
            ["ms"],
            "time_to_first_token.unit: expected `str | null`, got `array`",
        ),
        (
            "guidellm",
            ("benchmarks", 0, "metrics", "request_totals"),
            "x",
            "benchmarks[0].metrics.request_totals: expected `object | null`, got `str`",
        ),
        ("vllm", ("completed",), "many", "completed: expected `int | float | null`, got `str`"),
    ],
)
def test_the_reported_shapes_are_one_line_naming_the_field(tmp_path, tool, path, value, expected):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(replaced(json.loads(FILES[tool].read_text()), path, value)))
    with pytest.raises(ForeignResultError, match="bad.json") as refused:
        read_foreign(file)
    assert expected in str(refused.value)


def test_a_file_nested_100000_deep_is_refused_in_one_line(tmp_path):
    file = tmp_path / "deep.json"
    document = json.loads(VLLM.read_text())
    file.write_text(json.dumps(document)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ForeignResultError, match="nested deeper"):
        read_foreign(file)


def test_a_5_mb_label_is_cut_and_100000_benchmarks_are_refused(tmp_path):
    file = tmp_path / "label.json"
    file.write_text(json.dumps({**json.loads(VLLM.read_text()), "label": "L" * 5_000_000}))
    [row] = read_foreign(file)
    assert row["engine"].startswith("LLL") and len(row["engine"]) == MAX_LABEL_CHARS
    document = json.loads(GUIDELLM.read_text())
    document["benchmarks"] = [{"metrics": {"request_totals": {"successful": 1, "errored": 0}}}] * (
        MAX_GUIDELLM_BENCHMARKS + 1
    )
    file.write_text(json.dumps(document))
    with pytest.raises(
        ForeignResultError, match=f"benchmarks: expected `array` of length <= {MAX_GUIDELLM_BENCHMARKS}"
    ):
        read_foreign(file)
    document["benchmarks"] = document["benchmarks"][:MAX_GUIDELLM_BENCHMARKS]
    file.write_text(json.dumps(document))
    assert len(read_foreign(file)) == MAX_GUIDELLM_BENCHMARKS  # at the bound: read
