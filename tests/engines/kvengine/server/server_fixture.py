"""Our engine's HTTP server on a free loopback port, in a background thread of the test process."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

from aiohttp import web

from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.server.app import make_app
from kvbench.engines.kvengine.server.errors import AppRunner


@contextlib.contextmanager
def serving(engine: Engine, api_key: str | None = None, **app_options) -> Iterator[str]:
    """`app_options`: make_app's other keywords (admin_key, metrics_open, lane_limits)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async_engine = AsyncEngine(engine)
    async_engine.start()
    loop = asyncio.new_event_loop()
    runner = AppRunner(make_app(async_engine, api_key=api_key, **app_options), access_log=None)
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        async_engine.shutdown()
