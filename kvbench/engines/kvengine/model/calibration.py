"""Static KV scales from one fixed calibration forward pass.

Why static: pages are shared by requests and written at different times, so every writer must encode with
the scale every later reader decodes with. The engine calibrates once at start from a fixed text (the same
tokens every run, so results are reproducible), then installs the scales with `PagedKVCache.set_scales`.

    tensor mode:  scale[l]       = amax over tokens/heads/channels of |K_l|          * margin / fp8_max
    channel mode: scale[l, h, c] = amax over tokens of |K_l[t, h, c] - shift[t, h]|  * margin / fp8_max
    (same for V; shift = the per-token weighted mean that `fp8.encode` subtracts; see `fp8.calibrate_scale`;
    for K, channels c and c + D/2 share the bound of their RoPE rotation pair: `fp8.rope_pair_amax`)

The margin (default 2) is headroom for values beyond what the calibration text produced; anything larger
still saturates at the format's max instead of overflowing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvbench.engines.kvengine.core.kv_format import KVDtype, KVFormat
from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.engines.kvengine.model import fp8
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.kv_cache import KVScales, PagedKVCache
from kvbench.engines.kvengine.model.llama import LlamaForCausalLM

CALIBRATION_TEXT = (
    "The history of the city goes back more than two thousand years. In 1850 its population was 1,053,262; "
    "today it is a centre of science, trade and art.\n"
    "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n"
    "Question: what is 17 * 23? Answer: 17 * 23 = 391.\n"
    "La capitale de la France est Paris. Die Hauptstadt von Deutschland ist Berlin. "
    "El agua hierve a 100 grados Celsius. 東京は日本の首都です。\n"
    "User: Summarise the report in three bullet points.\nAssistant: - Revenue grew 12%.\n"
    "- Costs fell.\n- The outlook is stable.\n"
)


def calibration_token_ids(tokenizer: Any, text: str = CALIBRATION_TEXT) -> list[int]:
    """The fixed calibration prompt as token ids (with the tokenizer's BOS, as real prompts have it)."""
    return list(tokenizer(text)["input_ids"])


def calibrate_kv_scales(
    model: LlamaForCausalLM,
    token_ids: Sequence[int],
    fmt: KVFormat,
    *,
    margin: float = fp8.DEFAULT_MARGIN,
) -> KVScales:
    """Scales for `fmt` from K/V of one forward over `token_ids` (deterministic).

    Unquantized formats get unit scales (they are not used).
    """
    config = model.config
    if not fmt.quantized:
        return KVScales.unit(config, fmt)
    if not token_ids:
        raise ValueError("token_ids is empty: calibration needs at least one token")
    n = len(token_ids)
    page_size = DEFAULT_PAGE_SIZE  # any: the pages only hold this pass's unquantized K/V
    num_pages = -(-n // page_size)
    device = model.lm_head.weight.device
    exact = KVFormat(KVDtype.FP32)  # the values to calibrate on, unrounded
    cache = PagedKVCache(config, num_pages, page_size, exact, device, compute_dtype=model.lm_head.weight.dtype)
    model(ForwardBatch.build([SequenceChunk(list(token_ids), 0, range(num_pages))], page_size, device=device), cache)
    L, H, D = config.num_layers, config.num_kv_heads, config.head_dim
    scales = []
    for data, rope_pairs in ((cache.k_data, True), (cache.v_data, False)):  # keys are stored after RoPE
        x = data.reshape(L, -1, H, D)[:, :n]  # pages 0.. in order, so rows are positions 0..n-1
        scales.append(torch.stack([fp8.calibrate_scale(fmt, x[layer], margin, rope_pairs) for layer in range(L)]).cpu())
    return KVScales(scales[0], scales[1])
