"""`tiny-random` is built on the device and in the compute dtype the settings ask for (it once ignored both)."""

from __future__ import annotations

import pytest
import torch

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.settings.config import EngineConfig

from .tiers_fixtures import greedy, run, tokens


def tensors_of(engine: Engine) -> list[torch.Tensor]:
    cache = engine.kv_cache
    return [*engine.model.parameters(), cache.k_data, cache.v_data, cache.scales.k]


def served(device: str, compute_dtype: str) -> tuple[Engine, list[int]]:
    engine = Engine(EngineConfig(model="tiny-random", device=device, compute_dtype=compute_dtype, kv_capacity=256))
    return engine, tokens(run(engine, greedy("a", range(300, 340), 4))["a"])


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_tiny_random_lives_on_the_device_and_in_the_dtype_asked(compute_dtype):
    engine, out = served("cpu", compute_dtype)
    assert {t.device for t in tensors_of(engine)} == {torch.device("cpu")}
    assert {p.dtype for p in engine.model.parameters()} == {getattr(torch, compute_dtype)}
    assert len(out) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_random_on_cuda_serves_the_same_greedy_tokens_as_on_cpu():
    engine, out = served("cuda", "float32")
    assert {t.device.type for t in tensors_of(engine)} == {"cuda"}
    assert out == served("cpu", "float32")[1]
