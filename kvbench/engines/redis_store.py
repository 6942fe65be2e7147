"""A throwaway redis-server on a free loopback port: the remote tier of LMCache's and our engine's runs.

Started from the `redis-server` binary on PATH (Debian's package), with no persistence, its files in a folder the
caller owns, and stopped when the context ends. The benchmarks and the tests share this one starter.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.base import EngineError
from kvbench.engines.launch import free_port

READY_S = 5.0


@dataclass
class RedisServer:
    """A running redis-server: its URL (`redis://127.0.0.1:PORT/0`) and its process."""

    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    """Start redis-server on loopback with `folder` as its working folder; yields once it answers PING."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise EngineError("redis-server is not on PATH: install Debian's redis-server package")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(f"redis://127.0.0.1:{port}/0", process)
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + READY_S
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise EngineError(f"redis-server on port {port} did not answer within {READY_S:g} s") from None
                time.sleep(0.05)
        client.close()
        yield server
    finally:
        server.stop()
