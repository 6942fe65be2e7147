"""Shared helpers of the tier tests: an accelerated clock, a tiny engine, a run-to-completion loop, and a
real redis-server on a free loopback port (kvbench.engines.redis_store, re-exported here)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.engines.redis_store import RedisServer, redis_server  # the one starter (the benchmarks use it too)


@dataclass
class FakeClock:
    """Engine time that moves only when a test says so."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_engine(loaded, clock=time.monotonic, **settings) -> Engine:
    return Engine(EngineConfig(**{"kv_capacity": 2048, "tier_interval_s": 0.0, **settings}), loaded, clock)


def run(engine: Engine, *requests: GenerationRequest) -> dict[str, list]:
    for request in requests:
        engine.add(request)
    outputs: dict[str, list] = {request.request_id: [] for request in requests}
    steps = 0
    while engine.has_work():
        for output in engine.step():
            outputs[output.request_id].append(output)
        steps += 1
        assert steps < 10_000, "the engine did not finish"
    engine.pool.check_integrity()
    engine.index.check_integrity()
    return outputs


def tokens(outputs) -> list[int]:
    return [output.token_id for output in outputs if output.token_id is not None]


def greedy(request_id, prompt, max_tokens=8, **kw) -> GenerationRequest:
    return GenerationRequest(request_id, tuple(prompt), max_tokens, ignore_eos=True, **kw)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


__all__ = ["FakeClock", "RedisServer", "free_port", "greedy", "make_engine", "redis_server", "run", "tokens"]
