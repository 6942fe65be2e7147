"""A planted degradation of known size is found, and fp16 KV against fp32 KV is not (SmolLM2, 1,024 tokens).

The instrument: a KV "format" that stores fp32 but first rounds every (token, head) vector of K and V to a
symmetric integer grid of `levels` steps each side of zero (step = amax / levels), i.e. uniform rounding noise
of standard deviation step / sqrt(12) on every element -- INT4-like at 7 levels, far coarser than FP8's
3 mantissa bits. It is used only here, as a measurement instrument of known behaviour.
"""

from dataclasses import dataclass, field

import pytest
import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.evals.inprocess import position_pass, windows
from kvbench.evals.items import direct_metrics, make_items
from kvbench.evals.kv_settings import KVSetting
from kvbench.evals.tasks import corpus_text


class RoundingKVCache(PagedKVCache):
    """fp32 pages holding K/V rounded to `levels` integer steps per (token, head) before they are stored."""

    def __init__(self, *args, levels: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.levels = levels

    def write(self, layer, slots, k, v):
        super().write(layer, slots, self._round(k), self._round(v))

    def _round(self, x: torch.Tensor) -> torch.Tensor:
        step = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / self.levels
        return torch.round(x / step) * step


@dataclass(frozen=True)
class PlantedRounding:
    """A KV setting for `inprocess`: unquantized to the calibration code, rounded by its own cache."""

    levels: int
    kv_format: KVFormat = field(default_factory=lambda: KVFormat.from_settings("fp32", "tensor"))
    quantized: bool = False

    @property
    def label(self) -> str:
        return f"planted/round{self.levels}"

    def new_cache(self, config, num_pages, page_size, device, compute_dtype):
        return RoundingKVCache(
            config, num_pages, page_size, self.kv_format, device, compute_dtype=compute_dtype, levels=self.levels
        )


@pytest.mark.slow
def test_planted_rounding_is_significant_and_fp16_is_not():
    from kvbench.engines.kvengine.model.loader import load_model

    loaded = load_model("default")
    ids = list(loaded.tokenizer(corpus_text())["input_ids"])
    fp32, fp16, planted = KVSetting("fp32"), KVSetting("fp16"), PlantedRounding(7)
    scored = position_pass(loaded, fp32, [fp16, planted], windows(ids, 512, 1024))
    metrics = {label: {m.name: m for m in direct_metrics(make_items(scores, 64))} for label, scores in scored.items()}
    noisy = metrics[planted.label]["perplexity"].delta
    assert noisy.significant and noisy.ci_high < 0  # a loss, and its interval excludes no-change
    assert metrics[planted.label]["kl"].value > 1e-3
    half = metrics[fp16.label]["perplexity"].delta
    assert not half.significant  # the interval contains 0 (fp16 rounding of K/V is ~1e-4 relative)
    assert abs(half.ci_low) < 0.05 and abs(half.ci_high) < 0.05  # and it is narrow: this is resolution, not noise
