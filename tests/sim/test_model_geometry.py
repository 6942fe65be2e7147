"""Model geometry as the engines count it: gpt-oss's sliding layers and MXFP4 experts, fp8 checkpoints."""

import pytest

from kvbench.sim.config import MEMORY_VLLM, SimConfig
from kvbench.sim.geometry import WeightDtypes, geometry_from_config, load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset

GIB = 2**30


def test_gpt_oss_120b_kv_bytes_per_token_from_its_config():
    g = load_geometry("gpt-oss-120b")
    # config.json: 36 layers alternating sliding_attention / full_attention, 8 KV heads of 64, window 128.
    assert (g.num_layers, g.sliding_layers, g.full_layers, g.sliding_window) == (36, 18, 18, 128)
    per_layer = 2 * 8 * 64  # K and V elements per token and layer
    assert g.kv_bytes_per_token("bf16") == 18 * per_layer * 2 == 36_864  # the full layers pay per token
    assert g.kv_bytes_per_token("fp8") == 18_432
    # A sequence also keeps at most 128 tokens in each sliding layer.
    assert g.kv_bytes("bf16", 100) == 100 * 36_864 + 18 * per_layer * 2 * 100
    assert g.kv_bytes("bf16", 10_000) == 10_000 * 36_864 + 18 * per_layer * 2 * 128


def test_gpt_oss_120b_stores_experts_in_mxfp4_and_the_rest_in_bf16():
    g = load_geometry("gpt-oss-120b")
    assert g.weight_dtypes() == WeightDtypes(attention="bf16", mlp="bf16", experts="mxfp4", embeddings="bf16")
    experts = 36 * 128 * 3 * 2880 * 2880  # every layer's 128 experts: gate, up and down of 2880 x 2880
    assert g.num_params == pytest.approx(116.8e9, rel=0.01)  # the model card's 117B total
    assert g.active_params == pytest.approx(5.1e9, rel=0.02)  # and 5.1B active
    other = g.num_params - experts
    assert g.weight_bytes() == pytest.approx(experts * 4.25 / 8 + other * 2)  # 4 bits + an 8-bit scale per 32
    assert 60 * GIB < g.weight_bytes() < 62 * GIB  # not 233.6 GB of bf16


def test_gpt_oss_120b_fits_one_h100_and_its_bf16_weights_say_they_do_not():
    g = load_geometry("gpt-oss-120b")
    preset = get_preset("vllm-prefix")
    pages = SimConfig(g, load_hardware("h100"), preset, "bf16", memory_model=MEMORY_VLLM).device_pages()
    assert pages > 1000
    too_big = SimConfig(g, load_hardware("h100"), preset, "bf16", weight_dtype="bf16", memory_model=MEMORY_VLLM)
    with pytest.raises(ValueError, match=r"the weights do not fit: .* weights 217\.\d GiB"):
        too_big.device_pages()
    reserve = SimConfig(g, load_hardware("h100"), preset, "bf16", weight_dtype="bf16")
    with pytest.raises(ValueError, match=r"weights \(233\.\d GB\) do not fit on 1xh100"):
        reserve.device_pages()


def test_an_fp8_checkpoint_keeps_its_embeddings_in_bf16():
    config = {
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
        "intermediate_size": 4096,
        "vocab_size": 1000,
        "quantization_config": {"quant_method": "fp8"},
    }
    g = geometry_from_config(config, "small-fp8")
    embeddings = 2 * 1000 * 1024  # input embedding and the untied lm_head
    assert g.weight_dtype == "fp8"
    assert g.weight_bytes() == (g.num_params - embeddings) * 1 + embeddings * 2


def test_a_model_with_only_sliding_layers_pays_all_of_them_per_token():
    config = {
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
        "intermediate_size": 4096,
        "vocab_size": 1000,
        "sliding_window": 4096,
    }
    g = geometry_from_config(config, "mistral-like")
    assert g.sliding_layers == 4 and g.kv_bytes_per_token("bf16") == 4 * 2 * 2 * 128 * 2
    assert g.window_kv_bytes("bf16", 10_000) == 0.0
    off = geometry_from_config(config | {"use_sliding_window": False}, "qwen2-like")
    assert off.sliding_layers == 0 and off.sliding_window is None
