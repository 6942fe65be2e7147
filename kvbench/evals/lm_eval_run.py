"""lm-eval through `local-completions` against an OpenAI-compatible URL, on the shipped tasks (offline) and
lm-eval's own (their data from the Hugging Face hub, or from the datasets cache where the hub is unreachable
or HF_DATASETS_OFFLINE is set; data that is in neither is one error naming the task and the fix).

Loglikelihood tasks need the engine's prompt logprobs (`echo: true, logprobs: 1`) and a local tokenizer to
split context from continuation: we send token ids (`tokenized_requests=True`) tokenized with the engine's own
tokenizer folder, so the engine scores exactly the tokens lm-eval counted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.evals.tasks import DATA_DIR, TASKS, render_tasks
from kvbench.settings import SettingsError

OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class TaskDataError(SettingsError):
    """An lm-eval task whose data is neither in the local datasets cache nor reachable on the hub."""


@dataclass(frozen=True)
class TaskScore:
    """One metric of one task; `stderr` is None where lm-eval gives none (e.g. a single document).

    `per_doc` holds the metric of every document in doc_id order where it is one number per document (accuracy,
    exact match): what paired deltas and McNemar need. Empty for corpus-level metrics (perplexity)."""

    task: str
    metric: str
    value: float
    stderr: float | None
    samples: int
    per_doc: tuple[float, ...] = ()
    higher_is_better: bool | None = None  # lm-eval's own `higher_is_better` for this metric (None: not given)


@dataclass(frozen=True)
class LMEvalOptions:
    """How lm-eval talks to the engine. `limit`: documents per task (None: all)."""

    tokenizer: Path
    model_name: str = "kvengine"
    limit: int | None = None
    num_concurrent: int = 2
    max_length: int = 2048
    bootstrap_iters: int = 1000  # perplexity stderr comes from a bootstrap; lm-eval's default 100k is slow
    data_dir: Path = DATA_DIR  # where the tasks' YAML and JSONL live (a test points it at its own documents)


def run_lm_eval(base_url: str, tasks: Sequence[str], options: LMEvalOptions, work_dir: Path) -> list[TaskScore]:
    """Run `tasks` against `base_url` (no /v1); returns every numeric metric with its standard error."""
    own = [name for name in tasks if name not in TASKS]
    if not own:
        os.environ.update(OFFLINE_ENV)  # before lm_eval imports datasets: every shipped task reads local files only
    import lm_eval
    from lm_eval.tasks import TaskManager

    task_dir = render_tasks(tasks, work_dir / "lm_eval_tasks", options.data_dir)
    manager = TaskManager(include_path=str(task_dir), include_defaults=bool(own))
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{base_url.rstrip('/')}/v1/completions",
            "model": options.model_name,
            "tokenizer": str(options.tokenizer),
            "tokenizer_backend": "huggingface",
            "tokenized_requests": True,
            "num_concurrent": options.num_concurrent,
            "max_length": options.max_length,
            "max_retries": 1,
        },
        tasks=load_tasks(tasks, manager),
        limit=options.limit,
        task_manager=manager,
        bootstrap_iters=options.bootstrap_iters,
        log_samples=True,  # per-document metrics: the paired deltas
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    return scores_from_results(results)


def load_tasks(names: Sequence[str], manager) -> list:
    """lm-eval's task objects of `names` (a group stays its name), each loaded on its own so that data it cannot
    load is a `TaskDataError` naming the task and the fix, not a traceback from deep inside `datasets`."""
    loaded = []
    for name in names:
        try:
            found = manager.load([name])
        except OSError as exc:  # datasets: ConnectionError (hub unreachable, offline mode), DatasetNotFoundError
            raise TaskDataError(
                f"lm-eval task {name}: its data is not in this machine's Hugging Face datasets cache and the hub "
                f"cannot give it ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}). Fix: run this eval once "
                "where huggingface.co is reachable (the cache is then reused offline), or copy a filled cache here "
                f"and set HF_DATASETS_CACHE to it, or use a shipped task: {', '.join(TASKS)}"
            ) from None
        loaded.extend([name] if found.get("groups") else found["tasks"].values())
    return loaded


def scores_from_results(results: Mapping) -> list[TaskScore]:
    """lm-eval's {"results": {task: {"metric,filter": v, "metric_stderr,filter": se}}} as TaskScores, with
    every document's value from {"samples": {task: [{"doc_id", "filter", metric: value}]}} where logged, and
    lm-eval's direction of each metric from {"higher_is_better": {task: {metric: bool}}}."""
    out = []
    for task, values in results["results"].items():
        samples = int(results.get("n-samples", {}).get(task, {}).get("effective", 0))
        logged = results.get("samples", {}).get(task, [])
        directions = results.get("higher_is_better", {}).get(task, {})
        for key, value in values.items():
            metric, _, filter_name = key.partition(",")
            if metric.endswith("_stderr") or metric == "sample_len" or not isinstance(value, (int, float)):
                continue
            stderr = values.get(f"{metric}_stderr,{filter_name}")
            stderr = float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(stderr) else None
            better = directions.get(metric)
            out.append(
                TaskScore(
                    task,
                    metric,
                    float(value),
                    stderr,
                    samples,
                    _per_doc(logged, metric, filter_name),
                    better if isinstance(better, bool) else None,
                )
            )
    return out


def _per_doc(logged, metric: str, filter_name: str) -> tuple[float, ...]:
    rows = sorted((s for s in logged if s.get("filter") == filter_name), key=lambda s: s["doc_id"])
    if not rows or not all(isinstance(s.get(metric), (int, float, bool)) for s in rows):
        return ()
    return tuple(float(s[metric]) for s in rows)
