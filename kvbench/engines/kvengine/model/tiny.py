"""Tiny seeded random-weight models for tests that must run in milliseconds."""

from __future__ import annotations

import dataclasses

import torch

from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.llama import LlamaForCausalLM
from kvbench.engines.kvengine.model.parallel import SINGLE, TensorParallel

TINY_CONFIG = ModelConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def tiny_model(
    seed: int = 0,
    config: ModelConfig | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    parallel: TensorParallel = SINGLE,
    **overrides: object,
) -> LlamaForCausalLM:
    """A `LlamaForCausalLM` with deterministic random weights; `overrides` replace `TINY_CONFIG` fields. With
    several ranks, this rank's shard of the same weights (drawn whole, then cut).

    Weights are drawn with std 0.2 (larger than a trained model's init) so attention patterns are sharp and
    paging mistakes change the logits visibly.
    """
    config = dataclasses.replace(config or TINY_CONFIG, **overrides)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    if parallel.size > 1:
        state = {
            name: t
            for name, t in model.state_dict().items()
            if name != "lm_head.weight" or not config.tie_word_embeddings
        }
        model = LlamaForCausalLM(config, parallel=parallel)
        model.load_hf_state_dict(parallel.shard_state_dict(state, config))
    return model.to(device=device, dtype=dtype).eval()
