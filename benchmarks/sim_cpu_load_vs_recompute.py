"""The vLLM blog's Figure 1 as the simulator has it: TTFT of one prefill request recomputed vs loaded from vLLM's
native CPU offload tier, Llama-3.1-8B on 1 x H100 (the profile's host link, GPU prefix cache off as in the blog).

    python benchmarks/sim_cpu_load_vs_recompute.py

Published values (/work/shared/published/vllm-blog-kv-offloading-connector-2026-01-08.md, read off the figure,
about +-2% of full scale) beside the simulated ones and their ratios. A check of the restore cost model (a load
at the host link's bandwidth, then the step that computes the last token), not a test.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.scheduler import Request, RequestId
from kvbench.sim.config import SimConfig
from kvbench.sim.fleet import build_nodes
from kvbench.sim.geometry import geometry_from_config
from kvbench.sim.hardware import load_hardware
from kvbench.sim.kv_offload import parse_kv_offload
from kvbench.sim.presets import get_preset

# meta-llama/Llama-3.1-8B's config.json fields the geometry reads (128 KiB of bf16 KV a token).
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# K tokens -> (recompute ms, load from CPU ms), Figure 1.
PUBLISHED = {1: (30, 15), 10: (260, 40), 30: (1100, 100), 50: (2290, 160), 80: (4790, 250), 100: (6850, 310)}


def ttft_ms(k_tokens: int, from_cpu: bool) -> float:
    spec = parse_kv_offload({"medium": "cpu", "connector": "vllm-native", "bytes_per_replica": 400e9})
    config = SimConfig(
        geometry_from_config(LLAMA_31_8B, "llama-3.1-8b"),
        load_hardware("h100"),
        dataclasses.replace(get_preset("vllm-prefix"), max_step_tokens=8192),
        "bf16",
        "bf16",
        200_000,
        kv_offload=spec,
    )
    [node] = build_nodes(config)
    prompt = np.arange(1, k_tokens * 1000 + 1, dtype=np.int32)
    request = Request(RequestId("r"), prompt, 1, tenant=TenantId("t"))
    if from_cpu:
        node.below.lanes[0].tier.store(node._namespace(request), prompt, TenantId("t"), 0.0)
    node.admit(request, np.array([7]), node.plan_restore(request, 0.0), 0.0)
    now = 0.0
    while node.has_work():
        started = node.begin_step(now)
        if started is None:  # the load is in flight
            now = node.wake_at
            continue
        plan, seconds = started
        now += seconds
        node.end_step(plan, now)
    return now * 1e3


def main() -> None:
    print("prompt | recompute: sim / published (ratio) | load from cpu: sim / published (ratio) | gain sim / pub")
    for k, (recompute, load) in PUBLISHED.items():
        sim_re, sim_load = ttft_ms(k, False), ttft_ms(k, True)
        print(
            f"{k:4d}K  | {sim_re:7.0f} / {recompute:5d} ms ({sim_re / recompute:.2f}) | {sim_load:5.0f} / {load:4d} ms "
            f"({sim_load / load:.2f}) | {sim_re / sim_load:5.1f} / {recompute / load:5.1f}"
        )


if __name__ == "__main__":
    main()
