"""Run the measurement instrument in the test's own event loop, or as its own process, on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

from aiohttp import web

from kvbench.engines.http import request
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
