"""Loads a workload can actually carry: a point never asks for more than its workload can give, silently.

A session has one request in flight at a time, so a workload of S sessions has at most S in flight: a closed
loop (or an open loop's max_concurrency) above S is capped at S, and a request budget above the workload's
requests sends the workload's. Each cap comes with one line saying so; the point's id keeps the load it was
asked for, so its run folder and resume still match the config.
"""

from __future__ import annotations

import dataclasses

from kvbench.measure.schedule import LoadSpec
from kvbench.workloads.spec import Workload


def possible_load(load: LoadSpec, workload: Workload) -> tuple[LoadSpec, tuple[str, ...]]:
    """`load` capped to what `workload` can have in flight and send, and a one-line warning per cap."""
    sessions, requests = len(workload.sessions), workload.num_requests
    warnings = []
    if load.stage is None and load.cap is not None and load.cap > sessions:
        field = "concurrency" if load.concurrency is not None else "max_concurrency"
        warnings.append(
            f"{workload.name}: {field} {load.cap} capped at {sessions}: its {sessions} sessions have at "
            f"most {sessions} requests in flight (more sessions: --num-sessions)"
        )
        load = dataclasses.replace(load, **{field: sessions})
    if load.stage is None and load.num_requests is not None and load.num_requests > requests:
        warnings.append(
            f"{workload.name}: {load.num_requests} requests asked, its {sessions} sessions have "
            f"{requests}: {requests} are sent (more sessions: --num-sessions)"
        )
        load = dataclasses.replace(load, num_requests=requests)
    return load, tuple(warnings)
