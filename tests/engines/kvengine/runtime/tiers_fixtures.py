"""Shared helpers of the tier tests: an accelerated clock, a tiny engine, a run-to-completion loop, and a
real redis-server on a free loopback port in a temp dir (started from the binary on PATH, then stopped)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.settings.config import EngineConfig


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


@dataclass
class RedisServer:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@contextlib.contextmanager
def redis_server(tmp: Path) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH: install Debian's redis-server package")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(f"redis://127.0.0.1:{port}/0", process)
    try:
        import redis

        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not answer within 5 s")
        yield server
    finally:
        server.stop()
