"""Run the measurement instrument in the test's own event loop, on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

from aiohttp import web

from kvbench.harness.instrument import InstrumentLog, make_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serving(behaviour) -> AsyncIterator[tuple[str, InstrumentLog]]:
    log = InstrumentLog()
    runner = web.AppRunner(make_app(behaviour, log), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        await runner.cleanup()
