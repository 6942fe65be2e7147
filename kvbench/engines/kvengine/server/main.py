"""`kvbench serve`: our engine behind its OpenAI-compatible server, as a process of its own.

With `--tensor-parallel-size N` this process is rank 0 (the scheduler and the one HTTP server) and starts
ranks 1..N-1 (`server/ranks.py`); a rank that dies takes the server down (exit 1) with a line naming it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
import threading
from pathlib import Path

from kvbench.engines.kvengine.settings import openmp
from kvbench.engines.kvengine.settings.config import ADMIN_KEY_ENV, TIER_SECRET_ENV, EngineConfig, ServeOptions
from kvbench.engines.kvengine.settings.flags import add_flags, from_args

EXIT_ENGINE_FAILED = 1
EXIT_USAGE = 2  # bad settings (a bad tenants file, a bad flag value), as the kvbench CLI exits
MAX_SECRET_CHARS = 4096
RANK_EXIT_GRACE_S = 10.0  # after a rank died: how long a graceful shutdown may take before the process exits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `kvbench serve`: one per engine setting (`EngineConfig`), then the server's own."""
    add_flags(parser.add_argument_group("engine (as in YAML: --kv-capacity is kv_capacity)"), EngineConfig)
    add_flags(parser.add_argument_group("server"), ServeOptions)
    parser.add_argument("--tier-secret", type=_no_secret_flag, help=argparse.SUPPRESS)  # else a prefix of -file


def _no_secret_flag(text: str) -> None:
    raise argparse.ArgumentTypeError(
        f"a secret is never a flag (argv is public on the machine): put it in a file "
        f"(--tier-secret-file) or ${TIER_SECRET_ENV}"
    )


def tier_secret(path: str | None) -> str | None:
    """The tier secret: the first line of `path`, else $KVENGINE_TIER_SECRET, else None. Never a flag: argv is
    in /proc/PID/cmdline and `ps` for every user of the machine. SettingsError for a file that cannot be read."""
    from kvbench.settings import SettingsError

    if path is None:
        return os.environ.get(TIER_SECRET_ENV) or None
    try:
        with open(path, encoding="utf-8") as file:
            secret = file.readline(MAX_SECRET_CHARS + 1).rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(
            f"tier_secret_file: cannot read {path!r} ({type(exc).__name__}); give a readable "
            "UTF-8 file whose first line is the secret"
        ) from None
    if not secret or len(secret) > MAX_SECRET_CHARS:
        raise SettingsError(
            f"tier_secret_file: the first line of {path!r} must hold the secret (1 to {MAX_SECRET_CHARS} characters)"
        )
    return secret


def serve(args: argparse.Namespace) -> int:
    """Serve until stopped (0) or until the engine fails (EXIT_ENGINE_FAILED). Bad settings raise
    SettingsError (one line: the field and the fix) before the model loads where they can."""
    openmp.apply()
    from kvbench.engines.kvengine.settings.tenants import load_tenants

    config, options = from_args(EngineConfig, args), from_args(ServeOptions, args)
    config = dataclasses.replace(config, tier_secret=tier_secret(config.tier_secret_file))
    if config.tenants_file:
        load_tenants(config.tenants_file)  # a bad file is reported now, not after loading the model

    import torch

    from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
    from kvbench.engines.kvengine.runtime.budget_probe import build_engine
    from kvbench.engines.kvengine.runtime.memory_budget import fit_memory, free_device_bytes
    from kvbench.engines.kvengine.runtime.model_runner import Ranks, model_config_of, rank_device
    from kvbench.engines.kvengine.runtime.step_probe import StepLog
    from kvbench.engines.kvengine.server.app import make_app
    from kvbench.engines.kvengine.server.ranks import RankProcesses

    # Before anything is allocated or started: one line naming the setting to change if it cannot fit.
    config, budget = fit_memory(model_config_of(config), config, free_device_bytes(rank_device(config.device, 0)))
    if config.threads:
        torch.set_num_threads(config.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("kvbench.serve")
    log.info("memory budget per device: %s", budget.describe())
    log.info("loading %s (kv %s, %d tokens of device KV)", config.model, config.kv_format.label, budget.kv_tokens)
    loop: list[asyncio.AbstractEventLoop] = []  # the server's loop, once it runs
    rank_failure: list[str] = []
    stopping = threading.Event()

    def stop_serving() -> None:
        """Leave `run_app` (from any thread; a second failure while stopping changes nothing)."""
        if loop and not stopping.is_set():
            stopping.set()
            loop[0].call_soon_threadsafe(_graceful_exit)

    workers = RankProcesses(config) if config.tensor_parallel_size > 1 else None
    ranks = Ranks()
    if workers is not None:

        def rank_exited(rank: int, pid: int, code: int) -> None:
            """A worker rank died: the model cannot run without it. Stop serving (exit 1); should the engine
            thread hang in a collective (NCCL waits for the dead peer), exit anyway after a grace period."""
            rank_failure.append(f"tensor-parallel rank {rank} (pid {pid}) exited with code {code}")
            log.error("%s: stopping the server", rank_failure[0])
            threading.Timer(RANK_EXIT_GRACE_S, os._exit, (EXIT_ENGINE_FAILED,)).start()
            if not loop:  # still starting (the main thread may wait in the rendezvous): nothing to clean up
                os._exit(EXIT_ENGINE_FAILED)
            stop_serving()

        ranks = workers.start(on_exit=rank_exited)
    engine = build_engine(config, ranks=ranks)
    if engine.prefill_budget is not None:
        log.info("prefill budget: %s", engine.prefill_budget.describe())
    if options.step_log:
        engine.step_listeners.append(StepLog(Path(options.step_log)))

    def exit_on_failure(exc: BaseException) -> None:
        """The engine thread died: stop serving, so that `serve` returns non-zero and a supervisor sees it."""
        log.error("engine failure, exiting: %s: %s", type(exc).__name__, exc)
        stop_serving()

    async_engine = AsyncEngine(engine, on_fatal=exit_on_failure)
    admin_key = options.admin_key or os.environ.get(ADMIN_KEY_ENV)
    app = make_app(
        async_engine,
        api_key=options.api_key,
        admin_key=admin_key,
        metrics_open=options.metrics_open,
        stall_timeout_s=options.stall_timeout_s,
    )

    async def remember_loop(app) -> None:
        loop.append(asyncio.get_running_loop())
        async_engine.start()  # after the loop is known, so that a failure can always stop it

    async def stop_engine(app) -> None:
        await asyncio.get_running_loop().run_in_executor(None, async_engine.shutdown)
        if workers is not None:
            workers.close()

    app.on_startup.append(remember_loop)
    app.on_cleanup.append(stop_engine)
    log.info(
        "serving %s on http://%s:%d (%d KV bytes per token)",
        engine.model_name,
        options.host,
        options.port,
        engine.bytes_per_token,
    )
    _run_app(app, options.host, options.port)
    return EXIT_ENGINE_FAILED if async_engine.failure is not None or rank_failure else 0


def _run_app(app, host: str, port: int) -> None:
    """`web.run_app`, with the server's own AppRunner (parser errors answered without echoing bytes): serve until
    SIGINT/SIGTERM or `_graceful_exit`, then clean up (the engine stops in the app's cleanup)."""
    from aiohttp import web

    from kvbench.engines.kvengine.server.errors import AppRunner

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    runner = AppRunner(app, access_log=None, handle_signals=True)
    try:
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, host, port).start())
        loop.run_forever()
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()


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
