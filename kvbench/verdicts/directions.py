"""Which way is better, for every metric `kvbench eval` writes to eval.json: taken from the metric's source,
never guessed from the words in its name (a guess read `kvb_britannica_ppl/bits_per_byte` as higher-is-better).

- lm-eval metrics ("TASK/METRIC"): lm-eval's own `higher_is_better`. A run records it in eval.json from
  lm-eval's results (`results["higher_is_better"][task][metric]`); for an eval.json written before that, the
  shipped task's YAML `metric_list` (what lm-eval reads it from), then lm-eval's metric registry.
- our own measures (divergence, greedy, passkey, the aggregate): the table below, one line per measure.
- anything else: unknown (None), which the gate reports as inconclusive instead of judging it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

import yaml

from kvbench.evals.tasks import DATA_DIR, TASKS

# Our measures (evals/items.py, evals/results.py): True when a higher value is better.
OWN_METRICS: Mapping[str, bool] = {
    "kl": False,  # KL divergence from the baseline's next-token distribution
    "top1_agreement": True,  # share of positions whose argmax matches the baseline's
    "perplexity": False,  # exp(mean NLL) of the corpus under this KV setting
    "next_token_acc": True,
    "greedy_exact_match": True,  # share of prompts whose greedy answer equals the baseline's
    "greedy_first_diff_pos": True,  # mean position of the first differing token: later is better
    "greedy_matching_prefix": True,
    "aggregate_delta_pct": True,  # signed so that negative is a loss (evals/results.py)
}
_OWN_PATTERNS = ((re.compile(r"passkey@\d+"), True),)  # share of passkeys retrieved at a context length


def higher_is_better(name: str, recorded: Mapping[str, bool] | None = None) -> bool | None:
    """True/False from the metric's source (see the module docstring); None when no source declares it.
    `recorded` is what the eval.json that holds the metric says (it wins: it came from the run's lm-eval)."""
    if recorded and isinstance(recorded.get(name), bool):
        return recorded[name]
    if name in OWN_METRICS:
        return OWN_METRICS[name]
    if any(pattern.fullmatch(name) for pattern, _ in _OWN_PATTERNS):
        return next(better for pattern, better in _OWN_PATTERNS if pattern.fullmatch(name))
    task, sep, metric = name.partition("/")
    if not sep:
        return None
    declared = _task_directions(task).get(metric)
    return declared if declared is not None else _lm_eval_registry(metric)


@functools.lru_cache(maxsize=None)
def _task_directions(task: str) -> Mapping[str, bool]:
    """A shipped task's `metric_list[].higher_is_better`, as lm-eval reads it from the task's YAML."""
    if task not in TASKS:
        return {}
    config = yaml.safe_load((DATA_DIR / f"{task}.yaml").read_text())
    return {
        item["metric"]: item["higher_is_better"]
        for item in config.get("metric_list", ())
        if isinstance(item.get("higher_is_better"), bool)
    }


def _lm_eval_registry(metric: str) -> bool | None:
    """lm-eval's registry of its built-in metrics (None without lm-eval, or for a metric it does not know)."""
    try:
        from lm_eval.api.registry import is_higher_better
    except ImportError:
        return None
    try:
        value = is_higher_better(metric)
    except (KeyError, ValueError):
        return None
    return value if isinstance(value, bool) else None
