"""vLLM's KV memory arithmetic against vLLM's formula (gpu_worker.determine_available_memory, request_memory,
kv_cache_utils: blocks = (ceil(total * util) - weights - activation - non-torch) // bytes per block), on two
shapes worked out by hand."""

import math

from kvbench.sim.geometry import load_geometry
from kvbench.sim.vllm_memory import vllm_memory

GIB = 2**30


def test_qwen3_32b_on_two_h100_block_64():
    g = load_geometry("qwen3-32b")
    total = 79.19 * GIB
    m = vllm_memory(g, total, 2, 0.9, 64, 8192, 1024, "bf16", activation_bytes=2 * GIB, non_torch_bytes=GIB)
    requested = math.ceil(total * 0.9)
    weights = 32_761_446_400 * 2 / 2  # 32.76 B parameters in bf16, halved by TP
    per_block = 64 * 64 * 2 * (8 // 2) * 128 * 2  # block x layers x K,V x KV heads per rank x head dim x bytes
    assert per_block == 8 * 2**20
    blocks = int((requested - weights - 2 * GIB - GIB) // per_block)
    assert m.num_blocks == blocks and m.kv_tokens == (blocks - 1) * 64
    assert 280_000 < m.kv_tokens < 330_000


def test_llama_70b_on_four_h200_fp8_kv_block_16():
    g = load_geometry("llama-3.3-70b")
    total = 141e9
    m = vllm_memory(g, total, 4, 0.95, 16, 2048, 256, "fp8", activation_bytes=1.5 * GIB, non_torch_bytes=0.75 * GIB)
    requested = math.ceil(total * 0.95)
    weights = g.weight_bytes() / 4
    per_block = 16 * 80 * 2 * (8 // 4) * 128 * 1  # fp8: one byte per element
    blocks = int((requested - weights - 1.5 * GIB - 0.75 * GIB) // per_block)
    assert m.bytes_per_block == per_block and m.num_blocks == blocks
    # A larger activation peak (bigger batches) leaves fewer blocks, by exactly the bytes it takes.
    bigger = vllm_memory(
        g,
        total,
        4,
        0.95,
        16,
        2048,
        256,
        "fp8",
        activation_bytes=1.5 * GIB + 100 * per_block,
        non_torch_bytes=0.75 * GIB,
    )
    assert bigger.num_blocks == blocks - 100
