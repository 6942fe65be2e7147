"""`kvbench serve`: our engine behind its OpenAI-compatible server, as a process of its own."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

DEFAULT_PORT = 8000
EXIT_ENGINE_FAILED = 1
EXIT_USAGE = 2  # bad settings (a bad tenants file, a bad flag value), as the kvbench CLI exits
ADMIN_KEY_ENV = "KVENGINE_ADMIN_KEY"  # an environment variable keeps the key out of argv (ps, logs)
# The names of kvbench.engines.kvengine.model.fp8.KV_DTYPES / SCALE_MODES, spelled out so that building the CLI
# does not import torch (a test checks they agree).
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3")
SCALE_MODES = ("tensor", "channel")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
ISOLATION_MODES = ("strict", "shared-prefix")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), a .gguf file, a safetensors folder, or 'tiny-random' (tests)")
    parser.add_argument("--kv-dtype", default="fp32", choices=KV_DTYPES, help="KV cache storage dtype")
    parser.add_argument("--kv-scale", default="tensor", choices=SCALE_MODES, help="fp8 scales: per tensor, or per channel + per-token shift")
    parser.add_argument("--kv-capacity", type=int, default=32768, help="device KV tier in tokens")
    parser.add_argument("--kv-capacity-bytes", type=int, help="device KV tier in bytes (overrides --kv-capacity)")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-step-tokens", type=int, default=512, help="token budget of one step (chunked prefill)")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compute-dtype", default="float32", choices=COMPUTE_DTYPES)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--served-model-name")
    parser.add_argument("--threads", type=int, help="torch threads (default: all cores, with a passive OpenMP wait)")
    parser.add_argument("--host-capacity", type=int, default=0, help="host-memory KV tier in tokens (0: none)")
    parser.add_argument("--disk-capacity", type=int, default=0, help="disk KV tier in tokens (0: none)")
    parser.add_argument("--disk-dir", help="directory of the disk tier's page files")
    parser.add_argument("--remote-url", help="shared Redis KV tier, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--device-ttl", type=float, default=30.0, help="seconds an idle page stays on device")
    parser.add_argument("--host-ttl", type=float, default=600.0, help="seconds an idle page stays in host memory")
    parser.add_argument("--tier-interval", type=float, default=1.0, help="seconds between tier placement passes")
    parser.add_argument("--tenants-file", help="YAML/JSON: API keys -> tenants, quotas, reservations, TTLs")
    parser.add_argument("--isolation", default="strict", choices=ISOLATION_MODES,
                        help="strict: no page shared across tenants; shared-prefix: the tenants file's "
                        "shared_prefixes (e.g. a system prompt) are shared, nothing else")
    parser.add_argument("--step-log", help="append every model step's token ranges and seconds to this JSONL file "
                        "(for `kvbench calibrate --steps`)")
    parser.add_argument("--api-key", help="require this Bearer key (tenant 'default'; it administers too unless "
                        "--admin-key is given)")
    parser.add_argument("--admin-key",  # no default here: --help would show the environment's key
                        help=f"the Bearer key of /reset_prefix_cache and /metrics (default: ${ADMIN_KEY_ENV}, "
                        "else --api-key); with any key configured, those endpoints need it")
    parser.add_argument("--metrics-open", action="store_true",
                        help="serve /metrics without a key (a Prometheus that sends none)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)


def engine_config(args: argparse.Namespace):
    from kvbench.engines.kvengine.runtime.engine import EngineConfig

    return EngineConfig(
        model=args.model,
        kv_dtype=args.kv_dtype,
        kv_scale=args.kv_scale,
        kv_capacity_tokens=args.kv_capacity,
        kv_capacity_bytes=args.kv_capacity_bytes,
        page_size=args.page_size,
        max_num_seqs=args.max_num_seqs,
        max_step_tokens=args.max_step_tokens,
        prefix_caching=not args.no_prefix_caching,
        device=args.device,
        compute_dtype=args.compute_dtype,
        max_model_len=args.max_model_len,
        served_model_name=args.served_model_name,
        host_capacity_tokens=args.host_capacity,
        disk_capacity_tokens=args.disk_capacity,
        disk_dir=args.disk_dir,
        remote_url=args.remote_url,
        device_ttl_s=args.device_ttl,
        host_ttl_s=args.host_ttl,
        tier_interval_s=args.tier_interval,
        tenants_file=args.tenants_file,
        isolation=args.isolation,
    )


def serve(args: argparse.Namespace) -> int:
    """Serve until stopped (0) or until the engine fails (EXIT_ENGINE_FAILED). Bad settings raise
    SettingsError (one line: the field and the fix) before the model loads where they can."""
    # Two torch threads spin against each other on this class of CPU unless OpenMP waits passively.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from kvbench.engines.kvengine.runtime.tenants_config import load_tenants
    from kvbench.settings import SettingsError

    try:
        config = engine_config(args)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    if config.tenants_file:
        load_tenants(config.tenants_file)  # a bad file is reported now, not after loading the model

    import torch
    from aiohttp import web

    from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
    from kvbench.engines.kvengine.runtime.engine import Engine
    from kvbench.engines.kvengine.runtime.step_probe import StepLog
    from kvbench.engines.kvengine.server.app import make_app

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("kvbench.serve")
    log.info("loading %s (kv %s/%s, %d tokens of device KV)", config.model, config.kv_dtype, config.kv_scale, config.kv_capacity_tokens)
    core = Engine(config)
    if args.step_log:
        core.step_listeners.append(StepLog(Path(args.step_log)))
    loop: list[asyncio.AbstractEventLoop] = []  # the server's loop, once it runs

    def exit_on_failure(exc: BaseException) -> None:
        """The engine thread died: stop serving, so that `serve` returns non-zero and a supervisor sees it."""
        log.error("engine failure, exiting: %s: %s", type(exc).__name__, exc)
        if loop:
            loop[0].call_soon_threadsafe(_graceful_exit)

    engine = AsyncEngine(core, on_fatal=exit_on_failure)
    admin_key = args.admin_key or os.environ.get(ADMIN_KEY_ENV)
    app = make_app(engine, api_key=args.api_key, admin_key=admin_key, metrics_open=args.metrics_open)

    async def remember_loop(app) -> None:
        loop.append(asyncio.get_running_loop())
        engine.start()  # after the loop is known, so that a failure can always stop it

    async def stop_engine(app) -> None:
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)

    app.on_startup.append(remember_loop)
    app.on_cleanup.append(stop_engine)
    log.info("serving %s on http://%s:%d (%d KV bytes per token)", core.model_name, args.host, args.port,
             core.bytes_per_token)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return EXIT_ENGINE_FAILED if engine.failure is not None else 0


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
