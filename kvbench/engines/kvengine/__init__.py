"""kvengine: kvbench's own LLM engine, in rooms whose imports point one way.

    core/      pure cache policies shared with the simulator: pages, prefix index, tenant ledger, tiers,
               scheduler, KV format names, adoption of restored pages. Imports nothing of torch, asyncio,
               aiohttp or files (tests/test_import_direction.py checks it), nor any other room.
    config.py  every engine setting (EngineConfig, ServeOptions, IsolationMode), defined once; flags.py
               makes `kvbench serve` flags and argv from it. Torch-free; imports core only.
    model/     torch: a Llama-family model over a paged, optionally FP8, KV store. Imports core.
    runtime/   the step loop (Engine), its thread (AsyncEngine), the offload executor that carries out the
               core's tier decisions on real bytes, the tenants file. Imports core, model and config.
    server/    the OpenAI-compatible HTTP server and `kvbench serve`. Imports runtime and config (and the
               model's SamplingParams, which a request carries).
    openmp.py  how the engine's OpenMP threads wait (one setting for every process that runs it). Imports os.
    adapter.py kvbench's adapter: launches `kvbench serve` as a process and talks HTTP to it. Imports only
               torch-free modules: config, flags, openmp and runtime.tenants_config.

server -> runtime -> model -> core, never back. The adapter is the engine registry's (a pyproject entry
point); nothing inside kvengine imports it.
"""
