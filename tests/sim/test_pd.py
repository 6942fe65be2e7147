"""Prefill/decode pools: a request is prefilled on the prefill pool, its KV handed to a decode node at the link's
bandwidth, and answered there. Hand-worked on one request: qwen2.5-72b with fp8 KV is 163,840 bytes a token;
a 100 Gb/s link moves 12.5e9 bytes a second."""

import pytest

from kvbench.measure.schedule import LoadSpec
from kvbench.sim.cost import SeqWork
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.kv_offload import parse_pd
from kvbench.sim.presets import get_preset
from kvbench.workloads.profiles import workload_from_mapping

KV_BYTES = 163_840
LINK = 100e9 / 8
NS = 1e9


def one_request(output_len: int = 4):
    return workload_from_mapping(
        {
            "generator": "shared_prefix",
            "num_groups": 1,
            "num_prompts_per_group": 1,
            "system_prompt_len": 1_000,
            "question_len": 40,
            "output_len": output_len,
        },
        "pd",
        num_sessions=1,
    )


def test_a_request_is_prefilled_handed_off_and_answered_by_the_decode_pool():
    pd = parse_pd({"prefill_replicas": 1, "decode_replicas": 1, "link_gbps": 100})
    config = SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset("vllm-prefix"), "fp8", "fp8", 20_000, pd=pd
    )
    result = simulate(one_request(), LoadSpec(), config)
    [record] = result.records
    assert record.ok and record.output_tokens == 4 and record.cached_tokens == 0
    length = record.prompt_tokens
    pages = (length - 1) // 16
    cost = config.cost
    prefill_s = cost.step([SeqWork(0, length)]).seconds  # the prefill node computes the whole prompt
    transfer_s = pages * 16 * KV_BYTES / LINK  # its full pages cross the link
    first_s = cost.step([SeqWork(pages * 16, length)]).seconds  # the decode node computes the rest, samples
    assert (record.first_token_ns - record.sent_ns) / NS == pytest.approx(prefill_s + transfer_s + first_s, rel=1e-6)
    prefill_node, decode_node = result.nodes
    assert prefill_node["steps"] == 1 and decode_node["steps"] == 4
    assert result.node_of[record.request_id] == 0


def test_the_decode_pool_is_the_fewest_requests_in_flight():
    pd = parse_pd({"prefill_replicas": 1, "decode_replicas": 2, "link_gbps": 100})
    config = SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset("vllm-prefix"), "fp8", "fp8", 20_000, pd=pd
    )
    work = workload_from_mapping(
        {
            "generator": "shared_prefix",
            "num_groups": 2,
            "num_prompts_per_group": 1,
            "system_prompt_len": 500,
            "question_len": 40,
            "output_len": 200,
        },
        "pd",
        num_sessions=2,
    )
    result = simulate(work, LoadSpec(rate=1000.0), config)
    assert all(r.ok for r in result.records)
    # Both decodes overlap in time: each went to a different decode node.
    assert [n["steps"] > 0 for n in result.nodes] == [True, True, True]
