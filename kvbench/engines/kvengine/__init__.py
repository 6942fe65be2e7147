"""kvengine: kvbench's own LLM engine, in rooms whose imports point one way.

    core/      pure cache policies shared with the simulator: pages, prefix index, tenant ledger, tiers,
               scheduler, KV format names, adoption of restored pages. Imports nothing of torch, asyncio,
               aiohttp or files (tests/test_import_direction.py checks it), nor any other room.
    settings/  every engine setting (config.py: EngineConfig, ServeOptions, IsolationMode), defined once;
               flags.py makes `kvbench serve` flags and argv from it; openmp.py says how the engine's OpenMP
               threads wait; tenants.py reads a tenants file. Torch-free; imports core only, so the server,
               the runtime, the adapter, the simulator and the CLI all read settings from one floor.
    model/     torch: a Llama-family model over a paged, optionally FP8, KV store. Imports core.
    runtime/   the step loop (Engine), its thread (AsyncEngine), the offload executor that carries out the
               core's tier decisions on real bytes. Imports core, model and settings.
    server/    the OpenAI-compatible HTTP server and `kvbench serve`. Imports runtime and settings (and the
               model's SamplingParams, which a request carries).
    adapter.py kvbench's adapter: launches `kvbench serve` as a process and talks HTTP to it. Imports only
               torch-free modules: settings/.

server -> runtime -> model -> core and settings -> core, never back. The adapter is the engine registry's (a pyproject entry
point); nothing inside kvengine imports it.
"""
