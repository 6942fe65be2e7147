"""The per-layer K/V error profile on the tiny model: E5M2 (2 mantissa bits) loses more than E4M3 (3 bits)
in every layer and head, and the outlier ratio is max|x| / rms(x) of the exact K/V."""

import pytest
import torch

from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.evals.kv_settings import KVSetting
from kvbench.evals.layers import exact_kv, layer_errors
from kvbench.evals.result_frames import layer_frames


def test_e5m2_error_exceeds_e4m3_everywhere_and_outliers_are_exact():
    tiny = tiny_loaded_model(seed=0)
    ids = list(range(50, 250))
    settings = [KVSetting("fp32"), KVSetting("fp8_e4m3", "tensor"), KVSetting("fp8_e5m2", "tensor")]
    errors = layer_errors(tiny, settings, ids)
    by = {(e.setting, e.tensor, e.layer, e.head): e for e in errors}
    layers, heads = tiny.config.num_layers, tiny.config.num_kv_heads
    assert len(errors) == 2 * 2 * layers * heads  # fp32 has no quantisation error to profile
    for tensor in ("K", "V"):
        for layer in range(layers):
            for head in range(heads):
                e4, e5 = by[("fp8_e4m3/tensor", tensor, layer, head)], by[("fp8_e5m2/tensor", tensor, layer, head)]
                assert 0 < e4.rel_error < e5.rel_error < 0.2
    k, _ = exact_kv(tiny, ids)
    x = k[0, :, 0]
    assert by[("fp8_e4m3/tensor", "K", 0, 0)].outlier == pytest.approx(
        float(x.abs().max() / x.pow(2).mean().sqrt()), rel=1e-5
    )
    summary, _ = layer_frames(errors)
    assert list(summary["setting"]) == ["fp8_e4m3/tensor", "fp8_e4m3/tensor", "fp8_e5m2/tensor", "fp8_e5m2/tensor"]
    assert torch.isfinite(torch.tensor(summary["mean_rel_error"].to_numpy())).all()
