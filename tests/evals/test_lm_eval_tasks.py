"""lm-eval's own tasks beside the shipped ones: the registry knows lm-eval's defaults, and a task whose data is
neither cached nor reachable (this machine has no hub) is one error naming the task and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.evals.lm_eval_run import LMEvalOptions, TaskDataError, run_lm_eval
from kvbench.evals.tasks import TASKS, check_tasks, lm_eval_task_names
from kvbench.settings import SettingsError

pytest.importorskip("lm_eval")


def test_the_task_registry_includes_lm_evals_defaults_and_shipped_tasks_stay_the_default():
    from kvbench.evals.runner import EvalConfig

    registry = lm_eval_task_names()
    assert {"arc_easy", "hellaswag", "lambada_openai"} <= registry and len(registry) > 1000
    assert check_tasks(("kvb_plays_mc", "arc_easy")) == ("kvb_plays_mc", "arc_easy")
    assert EvalConfig().tasks == tuple(TASKS)
    with pytest.raises(SettingsError, match=r"unknown arc_eazy.*lm-eval ls tasks.*e\.g\. arc_easy"):
        check_tasks(("arc_eazy",))


def test_a_known_task_whose_data_is_absent_names_the_task_and_the_fix(tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    # No hub here and an empty cache: what an air-gapped machine that never ran arc_easy has.
    for module in (datasets.config, huggingface_hub.constants):
        monkeypatch.setattr(module, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty-cache")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TaskDataError) as caught:
        run_lm_eval("http://127.0.0.1:9", ["arc_easy"], LMEvalOptions(tokenizer=Path("unused")), tmp_path)
    message = str(caught.value)
    assert message.startswith("lm-eval task arc_easy: its data is not in this machine's Hugging Face datasets cache")
    assert "huggingface.co is reachable" in message and "HF_DATASETS_CACHE" in message and "kvb_plays_mc" in message
    assert "\n" not in message


def test_the_registry_is_built_once_per_lm_eval_install_and_read_back_after(tmp_path, monkeypatch):
    """Building it reads ~15,000 YAMLs (seconds): the names are kept in the cache folder, keyed by the install.
    lm-eval's TaskManager is replaced by one that counts its builds (the test above reads the real registry)."""
    import importlib.metadata
    import types

    import lm_eval.tasks

    from kvbench.evals import tasks

    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path))
    builds = []
    monkeypatch.setattr(
        lm_eval.tasks,
        "TaskManager",
        lambda **kw: (
            builds.append(kw) or types.SimpleNamespace(all_tasks=["arc_easy", "hellaswag", f"build{len(builds)}"])
        ),
    )
    fresh = tasks.lm_eval_task_names.__wrapped__  # past the in-process cache
    first = fresh()
    path = tasks.registry_cache_file(importlib.metadata.distribution("lm_eval"))
    assert path.parent.parent == tmp_path and first == {"arc_easy", "hellaswag", "build1"}
    assert builds == [{"include_defaults": True}]
    assert fresh() == first and len(builds) == 1  # read back, not built again
    path.write_text("{not json")  # a damaged file is built again, and replaced
    assert fresh() == {"arc_easy", "hellaswag", "build2"} and len(builds) == 2
    assert set(json.loads(path.read_text())) == {"arc_easy", "hellaswag", "build2"}
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(blocked))  # a cache folder that cannot be made: built, not kept
    assert fresh() == {"arc_easy", "hellaswag", "build3"} and len(builds) == 3
