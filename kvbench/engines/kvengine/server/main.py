"""`kvbench serve`: our engine behind its OpenAI-compatible server, as a process of its own."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from kvbench.engines.kvengine.config import ADMIN_KEY_ENV, EngineConfig, ServeOptions
from kvbench.engines.kvengine.flags import add_flags, from_args

EXIT_ENGINE_FAILED = 1
EXIT_USAGE = 2  # bad settings (a bad tenants file, a bad flag value), as the kvbench CLI exits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `kvbench serve`: one per engine setting (`EngineConfig`), then the server's own."""
    add_flags(parser.add_argument_group("engine (as in YAML: --kv-capacity is kv_capacity)"), EngineConfig)
    add_flags(parser.add_argument_group("server"), ServeOptions)


def serve(args: argparse.Namespace) -> int:
    """Serve until stopped (0) or until the engine fails (EXIT_ENGINE_FAILED). Bad settings raise
    SettingsError (one line: the field and the fix) before the model loads where they can."""
    # Two torch threads spin against each other on this class of CPU unless OpenMP waits passively.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from kvbench.engines.kvengine.runtime.tenants_config import load_tenants

    config, options = from_args(EngineConfig, args), from_args(ServeOptions, args)
    if config.tenants_file:
        load_tenants(config.tenants_file)  # a bad file is reported now, not after loading the model

    import torch
    from aiohttp import web

    from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
    from kvbench.engines.kvengine.runtime.engine import Engine
    from kvbench.engines.kvengine.runtime.step_probe import StepLog
    from kvbench.engines.kvengine.server.app import make_app

    if config.threads:
        torch.set_num_threads(config.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("kvbench.serve")
    log.info("loading %s (kv %s, %d tokens of device KV)", config.model, config.kv_format.label, config.kv_capacity)
    engine = Engine(config)
    if options.step_log:
        engine.step_listeners.append(StepLog(Path(options.step_log)))
    loop: list[asyncio.AbstractEventLoop] = []  # the server's loop, once it runs

    def exit_on_failure(exc: BaseException) -> None:
        """The engine thread died: stop serving, so that `serve` returns non-zero and a supervisor sees it."""
        log.error("engine failure, exiting: %s: %s", type(exc).__name__, exc)
        if loop:
            loop[0].call_soon_threadsafe(_graceful_exit)

    async_engine = AsyncEngine(engine, on_fatal=exit_on_failure)
    admin_key = options.admin_key or os.environ.get(ADMIN_KEY_ENV)
    app = make_app(async_engine, api_key=options.api_key, admin_key=admin_key, metrics_open=options.metrics_open)

    async def remember_loop(app) -> None:
        loop.append(asyncio.get_running_loop())
        async_engine.start()  # after the loop is known, so that a failure can always stop it

    async def stop_engine(app) -> None:
        await asyncio.get_running_loop().run_in_executor(None, async_engine.shutdown)

    app.on_startup.append(remember_loop)
    app.on_cleanup.append(stop_engine)
    log.info("serving %s on http://%s:%d (%d KV bytes per token)", engine.model_name, options.host, options.port,
             engine.bytes_per_token)
    web.run_app(app, host=options.host, port=options.port, print=None, access_log=None)
    return EXIT_ENGINE_FAILED if async_engine.failure is not None else 0


def _graceful_exit() -> None:
    from aiohttp import web

    raise web.GracefulExit()  # out of the loop, as SIGTERM's handler does: run_app cleans up and returns


def main(argv: list[str] | None = None) -> int:
    from kvbench.settings import SettingsError

    parser = argparse.ArgumentParser(prog="kvbench serve", description=__doc__)
    add_arguments(parser)
    try:
        return serve(parser.parse_args(argv))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
