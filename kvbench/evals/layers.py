"""Where KV quantisation error lives: per layer and KV head, the relative error of K and V in each setting.

K and V of one unquantized forward over real text are encoded and decoded with the setting's own codec and
static scales (the engine's `fp8.encode` / `fp8.decode`, the scales it serves with), and for every
(layer, head) we report

    rel_error   ||decode(encode(x)) - x|| / ||x||   over the text's tokens and the head's channels
    outlier     max |x| / rms(x)                    a head whose few channels dwarf the rest (what channel
                                                    scales exist for: one tensor scale must cover them)

so a table row says which layers and heads gain from channel scales (rel_error tensor vs channel).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvbench.engines.kvengine.core.kv_format import KVDtype, KVFormat
from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.engines.kvengine.model import fp8
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.loader import LoadedModel
from kvbench.evals.inprocess import setting_scales
from kvbench.evals.kv_settings import KVSetting


@dataclass(frozen=True)
class LayerError:
    """One (setting, K or V, layer, head)."""

    setting: str
    tensor: str  # "K" or "V"
    layer: int
    head: int
    rel_error: float
    outlier: float


def exact_kv(loaded: LoadedModel, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Unrounded K and V `[layers, tokens, kv_heads, head_dim]` of one forward over `ids`."""
    config, model = loaded.config, loaded.model
    num_pages = -(-len(ids) // DEFAULT_PAGE_SIZE)
    device = model.lm_head.weight.device
    cache = PagedKVCache(
        config, num_pages, DEFAULT_PAGE_SIZE, KVFormat(KVDtype.FP32), device, compute_dtype=model.lm_head.weight.dtype
    )
    with torch.inference_mode():
        model(
            ForwardBatch.build([SequenceChunk(list(ids), 0, range(num_pages))], DEFAULT_PAGE_SIZE, device=device), cache
        )
    L, H, D = config.num_layers, config.num_kv_heads, config.head_dim
    n = len(ids)
    return cache.k_data.reshape(L, -1, H, D)[:, :n].float(), cache.v_data.reshape(L, -1, H, D)[:, :n].float()


def layer_errors(loaded: LoadedModel, settings: Sequence[KVSetting], ids: Sequence[int]) -> list[LayerError]:
    """The relative error and outlier ratio of every (quantized setting, K/V, layer, head) over `ids`."""
    k, v = exact_kv(loaded, ids)
    out = []
    for setting in settings:
        if not setting.quantized:
            continue
        scales = setting_scales(loaded, setting)
        for name, x, scale in (("K", k, scales.k), ("V", v, scales.v)):
            for layer in range(x.shape[0]):
                payload, shift = fp8.encode(setting.kv_format, x[layer], scale[layer])
                back = fp8.decode(setting.kv_format, payload, shift, scale[layer], torch.float32)
                err = (back - x[layer]).pow(2).sum(dim=(0, 2)).sqrt() / x[layer].pow(2).sum(
                    dim=(0, 2)
                ).sqrt().clamp_min(1e-12)
                rms = x[layer].pow(2).mean(dim=(0, 2)).sqrt().clamp_min(1e-12)
                peak = x[layer].abs().amax(dim=(0, 2))
                for head in range(x.shape[2]):
                    out.append(
                        LayerError(setting.label, name, layer, head, float(err[head]), float(peak[head] / rms[head]))
                    )
    return out
