"""A flag-built `kvbench run` sized to its workload: the default request budget never asks for more than the
workload has (so it warns of nothing the user did not ask), and `--num-requests`/`--num-prompts` beyond a
generated workload grows its sessions (a sized workload) instead of sending fewer than asked. A trace or a
dataset file cannot grow: there the run's cap warns in one line (harness/possible_load.py)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable

from kvbench.harness.config import ExperimentConfig
from kvbench.workloads.profiles import PROFILES, SHARED_PREFIX

GROW_STEPS = 8  # a session's requests are drawn, so a first guess can fall short; a few more tries reach it


def size_to_workload(
    config: ExperimentConfig, args: argparse.Namespace, default_requests: int, say: Callable[[str], None]
) -> ExperimentConfig:
    """`config` (from flags alone) with its request budget fitted to its one generated workload: the default
    (`default_requests`, no --num-requests given) lowered to the workload's requests; an asked budget beyond
    them met by more sessions (`say` tells which), unless --num-sessions fixed them."""
    budget = config.stop.num_requests
    if len(config.workloads) != 1 or budget is None or args.stages or args.duration_s is not None:
        return config
    spec = config.workloads[0]
    if spec.name not in PROFILES and spec.name != SHARED_PREFIX:
        return config  # a trace or dataset: read as it is, capped with a warning
    workload = spec.load(config.seed)
    if args.num_requests is None:  # the default budget: at most the workload's own
        stop = dataclasses.replace(config.stop, num_requests=min(default_requests, workload.num_requests))
        return dataclasses.replace(config, stop=stop)
    if budget <= workload.num_requests or args.num_sessions is not None:
        return config
    sessions, grown = len(workload.sessions), workload
    for _ in range(GROW_STEPS):
        sessions = max(sessions + 1, math.ceil(sessions * budget / max(grown.num_requests, 1)))
        grown = dataclasses.replace(spec, num_sessions=sessions).load(config.seed)
        if grown.num_requests >= budget:
            break
    say(
        f"{spec.name}: {budget} requests asked, its {len(workload.sessions)} sessions have {workload.num_requests}: "
        f"{sessions} sessions generated ({grown.num_requests} requests)"
    )
    return dataclasses.replace(config, workloads=(dataclasses.replace(spec, num_sessions=sessions),))
