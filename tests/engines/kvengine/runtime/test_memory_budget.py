"""The memory budget at start: its numbers for a known config equal a hand computation, `kv_capacity: auto`
takes the most pages that fit, a budget that cannot fit is refused naming the setting to change (in-process and
by `kvbench serve`: tests/data/bad_inputs/flags.yaml), and the kvengine rows of the 8xH200 configs fit 8 x 141 GB while the old row did not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from kvbench.engines.kvengine.adapter import KVEngineSettings
from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.runtime.memory_budget import fit_memory, plan_memory
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.settings import SettingsError

REPO = Path(__file__).resolve().parents[4]
# The config.json shape of Qwen/Qwen2.5-72B-Instruct, shipped for the simulator (no hub here): the same file.
QWEN_72B = ModelConfig.from_hf_dict(json.loads((REPO / "kvbench/sim/models/qwen2.5-72b.json").read_text()))
H200 = 141 * 10**9  # bytes of one device


def qwen_tp8(**settings) -> EngineConfig:
    return EngineConfig(
        **{
            "device": "cuda",
            "compute_dtype": "bfloat16",
            "kv_dtype": "bf16",
            "tensor_parallel_size": 8,
            "kv_capacity": 100_000,
            "max_model_len": 32768,
            **settings,
        }
    )


def test_the_budget_of_qwen_72b_at_tp8_equals_a_hand_computation():
    budget = plan_memory(QWEN_72B, qwen_tp8(), H200)
    # One rank of 8: 64/8 = 8 query heads, 8/8 = 1 KV head of 128, 29568/8 = 3696 MLP rows, 152064/8 = 19008
    # vocabulary rows of the embedding and (untied) of the LM head; bf16 = 2 bytes.
    hidden, q, kv, mlp, vocab = 8192, 8 * 128, 1 * 128, 3696, 19008
    layer = hidden * (q + 2 * kv) + (q + 2 * kv) + q * hidden + 3 * hidden * mlp + 2 * hidden  # + qkv biases, norms
    assert budget.weights == 2 * (80 * layer + 2 * vocab * hidden + hidden)
    assert budget.weights == pytest.approx(72.7e9 * 2 / 8, rel=0.01)  # Qwen2.5-72B: 72.7 B parameters
    assert budget.kv_bytes_per_token == 80 * 2 * 1 * 128 * 2  # layers x (K, V) x heads x head_dim x bf16
    pages = 100_000 // 16 + 1  # kv_capacity in 16-token pages, + the null page
    assert budget.kv == pages * 16 * 80 * 2 * 128 * 2 and budget.kv_tokens == 100_000
    t, s, ctx = 512, 16, 32768
    assert budget.activations == (
        (t * hidden * 4 + t * (8 + 2) * 128 + t * mlp * 3 + s * ctx * 1 * 128 * 2) * 2
        + t * 8 * ctx * 4
        + s * (vocab + 152064) * 4
    )
    assert budget.needed == budget.weights + budget.kv + budget.activations  # one rank per device
    assert budget.limit == int(0.9 * H200)


def test_auto_takes_the_most_pages_that_fit():
    free = 40 * 10**9
    resolved, budget = fit_memory(QWEN_72B, qwen_tp8(kv_capacity="auto"), free)
    assert budget.fits and resolved.kv_capacity == budget.kv_tokens > 0
    page = 16 * budget.kv_bytes_per_token
    assert budget.needed + page > budget.limit  # one page more would not fit
    fit_memory(QWEN_72B, resolved, free)  # the resolved number is itself accepted
    half = dataclasses.replace(qwen_tp8(kv_capacity="auto"), memory_utilization=0.6)
    assert fit_memory(QWEN_72B, half, free)[0].kv_capacity < resolved.kv_capacity


def test_too_much_kv_is_refused_naming_kv_capacity_and_the_most_that_fits():
    with pytest.raises(SettingsError) as refused:
        fit_memory(QWEN_72B, qwen_tp8(kv_capacity=4_000_000), H200)
    message = str(refused.value)
    assert "lower kv_capacity to at most" in message and "\n" not in message
    most = int(message.split("at most ")[1].split(" tokens")[0].replace(",", ""))
    fit_memory(QWEN_72B, qwen_tp8(kv_capacity=most), H200)
    with pytest.raises(SettingsError):
        fit_memory(QWEN_72B, qwen_tp8(kv_capacity=most + 16), H200)


def test_weights_that_do_not_fit_are_refused_naming_tensor_parallel_size():
    with pytest.raises(SettingsError, match=r"raise tensor_parallel_size \(now 1\).*max_num_seqs"):
        fit_memory(QWEN_72B, qwen_tp8(tensor_parallel_size=1, kv_capacity="auto"), H200)


def test_ranks_on_cpu_share_host_memory():
    one = plan_memory(QWEN_72B, qwen_tp8(device="cpu"), H200)
    assert one.ranks_per_memory == 8 and one.needed == 8 * one.per_rank


def kvengine_row(path: str, tmp_path: Path) -> EngineConfig:
    config = yaml.safe_load((REPO / path).read_text())
    (row,) = [engine for engine in config["engines"] if engine["engine"] == "kvengine"]
    return KVEngineSettings.parse(row["settings"], tmp_path).engine


@pytest.mark.parametrize("path", ["ci/nightly-gpu.yaml", "ci/seed-table.yaml"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_the_kvengine_rows_of_the_8xh200_configs_fit_and_the_old_row_did_not(path, kv_dtype, tmp_path):
    row = dataclasses.replace(kvengine_row(path, tmp_path), kv_dtype=kv_dtype)
    assert row.tensor_parallel_size == 8 and row.kv_capacity == "auto"
    resolved, budget = fit_memory(QWEN_72B, row, H200)
    assert budget.fits and resolved.kv_capacity >= 1_000_000  # tokens of KV on 8 x 141 GB, per rank's heads
    old = dataclasses.replace(row, tensor_parallel_size=1, kv_capacity=2_000_000)
    with pytest.raises(SettingsError, match="tensor_parallel_size"):
        fit_memory(QWEN_72B, old, H200)
