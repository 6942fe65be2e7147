"""How our engine's OpenMP threads wait between parallel regions: one setting for every process that runs the
engine (`kvbench serve`, its tensor-parallel ranks, `kvbench calibrate`, the adapter's launch), applied before
torch loads OpenMP. No imports beyond `os`: it runs first."""

from __future__ import annotations

import os

# OMP_WAIT_POLICY=PASSIVE: a thread done waiting sleeps instead of spinning on (two torch threads spinning without
# end fight each other on this class of 2-core machine). GOMP_SPINCOUNT (libgomp's count of spin iterations before
# it sleeps; set, it wins over the policy's 0): a decode step runs ~150 parallel regions (our kernels and torch's)
# a few to tens of us apart, and waking a sleeping thread for each cost ~35 us a region here (our decode
# attention on 3 sequences x 16 keys, 2 threads: 42 us a call asleep, 5 us spinning). Measured with
# `benchmarks/engine_bench.py --mixed 0,37` (batch 4, SmolLM2-135M fp32, 2 AVX-512 EPYC cores, three rounds
# alternated): pure decode step 53-66 ms -> 40-45 ms, 4 decodes + 37 prefill tokens 113-132 -> 94-120 ms.
ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "30000"}


def environment() -> dict[str, str]:
    """ENV, except where this process's environment says otherwise (a user's choice stands): for a child's."""
    return {name: os.environ.get(name, value) for name, value in ENV.items()}


def apply() -> None:
    """`environment()` into this process's own, before torch loads OpenMP."""
    os.environ.update(environment())
