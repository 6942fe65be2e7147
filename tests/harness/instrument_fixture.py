"""Run the measurement instrument in the test's own event loop, or as its own process, on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

from aiohttp import web

from kvbench.engines.http import request
from kvbench.harness.instrument import InstrumentLog, make_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def app_in_thread(runner: web.AppRunner) -> Iterator[str]:
    """Serve `runner`'s app on a free loopback port from its own event loop in a background thread (for tests whose
    client blocks the test's thread, e.g. `kvbench run` called in-process); cleaned up on exit."""
    port, loop, ready = free_port(), asyncio.new_event_loop(), threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


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


@contextlib.contextmanager
def instrument_process(*flags: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """The instrument as its own process (`python -m kvbench.harness.instrument FLAGS`), for tests that signal it
    or run `kvbench run` in-process; it is resumed (if stopped) and killed at the end, whatever happened."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "kvbench.harness.instrument", "--port", str(port), *flags])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not request("GET", f"{url}/health", timeout_s=1).ok:
            assert server.poll() is None and time.monotonic() < deadline, "the instrument did not start"
            time.sleep(0.1)
        yield url, server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
