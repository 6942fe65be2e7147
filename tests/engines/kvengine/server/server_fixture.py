"""Our engine's HTTP server on a free loopback port, in a background thread of the test process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.server.app import make_app
from kvbench.engines.kvengine.server.errors import AppRunner
from tests.harness.instrument_fixture import app_in_thread


@contextlib.contextmanager
def serving(engine: Engine, api_key: str | None = None, **app_options) -> Iterator[str]:
    """`app_options`: make_app's other keywords (admin_key, metrics_open, lane_limits)."""
    async_engine = AsyncEngine(engine)
    async_engine.start()
    runner = AppRunner(make_app(async_engine, api_key=api_key, **app_options), access_log=None)
    try:
        with app_in_thread(runner) as url:
            yield url
    finally:
        async_engine.shutdown()
