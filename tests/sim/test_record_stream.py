"""The simulator's record stream on the shipped Mooncake synthetic trace is the one the unoptimised simulator
produced, bit for bit: an optimisation of the simulator or of the core it drives may make it faster, never
different.

The expected digest was computed at commit ae4c19f (before the compact-plan optimisation of issue 19) with
exactly this configuration: every record's `to_json()` line, in the order `simulate` returns them, hashed
with SHA-256. It changes when a record gains a field or the simulator's behaviour changes on purpose; then
recompute it on the commit before the change and say so here.
"""

import hashlib
from pathlib import Path

from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload

TRACE = Path(__file__).resolve().parents[1] / "data" / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
# ae4c19f, qwen2.5-72b on 8xh200, vllm-prefix, fp8 KV, fp8 weights, the trace's own arrivals, seed 0.
DIGEST_AT_AE4C19F = "36dfcee4294352fe52e66c273c1ca64573190016e6b1c7fc87dc8dd54c3b84d8"


def record_stream_digest(records) -> str:
    digest = hashlib.sha256()
    for record in records:
        digest.update(record.to_json().encode())
        digest.update(b"\n")
    return digest.hexdigest()


def test_the_synthetic_trace_simulates_to_the_records_of_the_unoptimised_simulator():
    config = SimConfig(load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset("vllm-prefix"), "fp8", "fp8")
    result = simulate(load_workload(str(TRACE)), LoadSpec(), config)
    assert len(result.records) == 3993 and all(r.ok for r in result.records)
    assert record_stream_digest(result.records) == DIGEST_AT_AE4C19F
