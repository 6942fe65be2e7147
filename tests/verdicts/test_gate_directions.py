"""Every quality metric the nightly gate judges gets its direction from its source: lm-eval's own
`higher_is_better` for lm-eval metrics (asked of lm-eval's task objects here), kvbench's table for ours."""

import json
from pathlib import Path

import pytest

from kvbench.evals.lm_eval_run import scores_from_results
from kvbench.evals.results import SettingResult, eval_json
from kvbench.evals.tasks import TASKS, render_tasks
from kvbench.measure.run_folder import read_run_folder
from kvbench.verdicts.compare import Verdict, compare
from kvbench.verdicts.directions import OWN_METRICS, higher_is_better
from kvbench.verdicts.gate_metrics import quality_spec

RESULTS = Path(__file__).resolve().parents[2] / "results"
GATED = [RESULTS / "baselines" / "nightly-cpu" / "eval.json", RESULTS / "evals" / "eval.json"]


def gated_metrics() -> set[str]:
    return {name for path in GATED for item in json.loads(path.read_text())["settings"] for name in item["metrics"]}


@pytest.fixture(scope="module")
def lm_eval_directions(tmp_path_factory):
    """{task: {metric: higher_is_better}} as lm-eval's own task objects say, for every shipped task."""
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    folder = render_tasks(list(TASKS), tmp_path_factory.mktemp("tasks"))
    loaded = TaskManager(include_path=str(folder), include_defaults=False).load(list(TASKS))["tasks"]
    return {name: task.higher_is_better() for name, task in loaded.items()}


def test_every_gated_lm_eval_metric_has_lm_evals_direction(lm_eval_directions):
    lm_eval = sorted(name for name in gated_metrics() if "/" in name)
    assert "kvb_britannica_ppl/bits_per_byte" in lm_eval  # the one a name guess read as higher-is-better
    for name in lm_eval:
        task, metric = name.split("/")
        assert higher_is_better(name) is lm_eval_directions[task][metric], name
        assert quality_spec(name).better == ("higher" if lm_eval_directions[task][metric] else "lower"), name
    for task, directions in lm_eval_directions.items():  # and every metric the shipped tasks can produce
        for metric, better in directions.items():
            assert higher_is_better(f"{task}/{metric}") is better, (task, metric)


def test_every_gated_metric_of_our_own_is_in_the_declared_table():
    own = sorted(name for name in gated_metrics() if "/" not in name)
    assert own and all(higher_is_better(name) is not None for name in own), own
    assert set(own) - {name for name in own if name.startswith("passkey@")} <= set(OWN_METRICS)


def test_a_rise_in_bits_per_byte_is_a_regression(tmp_path):
    def folder(name, bits):
        path = tmp_path / name
        path.mkdir()
        (path / "summary.json").write_text(json.dumps({"runs": []}))
        (path / "eval.json").write_text(
            json.dumps(
                {"settings": [{"kv_setting": "fp8_e4m3", "metrics": {"kvb_britannica_ppl/bits_per_byte": bits}}]}
            )
        )
        return read_run_folder(path)

    (quality,) = compare(folder("base", 1.08), folder("new", 1.20)).rows
    assert quality.spec.better == "lower" and quality.verdict is Verdict.REGRESSION


def test_eval_json_records_lm_evals_direction_of_each_metric():
    results = {
        "results": {
            "kvb_britannica_ppl": {"bits_per_byte,none": 1.1, "word_perplexity,none": 80.0},
            "other_task": {"odd_score,none": 0.5},
        },
        "higher_is_better": {
            "kvb_britannica_ppl": {"bits_per_byte": False, "word_perplexity": False},
            "other_task": {"odd_score": False},
        },
    }
    scores = scores_from_results(results)
    assert {(s.metric, s.higher_is_better) for s in scores} == {
        ("bits_per_byte", False),
        ("word_perplexity", False),
        ("odd_score", False),
    }
    written = eval_json([SettingResult("fp32", task_scores=tuple(scores))], "fp32")
    directions = written["settings"][0]["higher_is_better"]
    assert directions["other_task/odd_score"] is False  # only lm-eval knows this one: recorded from its results
    assert directions["kvb_britannica_ppl/bits_per_byte"] is False and directions["aggregate_delta_pct"] is True
