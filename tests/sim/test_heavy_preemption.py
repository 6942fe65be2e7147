"""The simulator under the load that crashed the core in issue 27 (one node, many long sequences against a
small device KV: they preempt one another after generating hundreds of tokens): every request finishes, and
decode runs in one pass give the records of stepping one by one. Before the core's fix, the decode-run path
raised "evict_each: page N dropped from the index has another holder" here."""

import dataclasses

from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import load_workload


def test_heavy_preemption_finishes_every_request_with_or_without_decode_runs():
    # 64 one-turn sessions of ~830 prompt tokens (a 600-token system prompt shared by all) and ~400 generated
    # ones, arriving at 40/s, against 12,000 tokens of device KV: about 10 sequences fit.
    workload = load_workload(
        "rag-chat",
        num_sessions=64,
        seed=1,
        overrides=dict(
            system_tokens=600,
            corpus_docs=20,
            docs_per_session=2,
            doc_tokens=100,
            turns_mean=1.0,
            turns_max=1,
            user_tokens_mean=20.0,
            user_tokens_min=8,
            user_tokens_max=40,
            output_tokens_mean=400.0,
            output_tokens_cv=0.01,
            output_tokens_min=395,
            output_tokens_max=400,
            session_rate=40.0,
        ),
    )
    config = SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("h200"), get_preset("vllm-prefix"), "fp8", device_kv_tokens=12_000
    )
    runs = simulate(workload, LoadSpec(), config)
    steps = simulate(workload, LoadSpec(), dataclasses.replace(config, decode_runs=False))
    assert len(runs.records) == 64 and all(r.ok for r in runs.records)
    assert [r.to_json() for r in runs.records] == [r.to_json() for r in steps.records]
    assert runs.nodes[0]["preempted"] == steps.nodes[0]["preempted"] >= 50
    assert runs.nodes[0]["fast_forwarded"] > 0
