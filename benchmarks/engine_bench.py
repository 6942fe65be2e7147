"""Our engine on this machine, per KV dtype: prefill tok/s, decode tok/s at batch 1 and 8, bytes per token.

    python benchmarks/engine_bench.py [--model default] [--prompt 1024] [--decode 32] [--threads 2]
                                      [--formats fp32,fp8_e4m3/tensor] [--batches 1,8]

Prefill: one 1,024-token prompt, computed in chunks of the step budget, timed to its first token. Decode:
B requests whose prompts are already computed, generating `--decode` tokens each; tokens/s counts all of them.
This is a benchmark (it prints a table), not a test.

    python benchmarks/engine_bench.py --mixed 0,16,32,64 [--batches 4]

Mixed: B requests decoding, then a 512-token prompt arrives; with `max_prefill_beside_decodes` = P each step
computes the B decodes and P prompt tokens. Prints the median step time and its ratio to a pure decode step
of the same batch (what sets the engine's default budget: ITL while a prompt joins).

    python benchmarks/engine_bench.py --bandwidth

    python benchmarks/engine_bench.py --load 1,4 [--vllm-budget] [--co-load 0.2]

Load: `engine_vs_vllm.py`'s default load replayed in this process, no HTTP and no client (its NUM_PROMPTS
prompts of INPUT_LEN random tokens, OUTPUT_LEN output tokens each), at most C at a time (a finished request's
successor is added before the next step). TTFT, TPOT (per request, as vLLM's client counts it) and ITL from the
engine's own step timestamps: the model's share of what the served benchmark measures. `--vllm-budget` runs it
under vLLM's step budget (`engine_vs_vllm.VLLM_CPU_STEP_TOKENS`) instead of our default; `--co-load F` runs a
process beside it that keeps a core busy a fraction F of the time in 2.5 ms bursts (a client or server thread on
the same cores), to measure what such a neighbour costs a step of OpenMP threads.

Bandwidth: this CPU's copy and read bandwidth (a 1 GiB fp32 tensor, per wall and per CPU second) and the floor
it sets on a decode step, which reads every weight once: the model's weight bytes / the read bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from kvbench.engines.kvengine.settings import openmp

openmp.apply()  # before torch loads OpenMP: as our engine's servers run

import numpy as np  # noqa: E402
import torch  # noqa: E402
from engine_vs_vllm import INPUT_LEN, NUM_PROMPTS, OUTPUT_LEN, VLLM_CPU_STEP_TOKENS  # noqa: E402 (this folder's)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kvbench.engines.kvengine.model.loader import load_model  # noqa: E402
from kvbench.engines.kvengine.runtime.budget_probe import build_engine  # noqa: E402
from kvbench.engines.kvengine.runtime.engine import Engine  # noqa: E402
from kvbench.engines.kvengine.runtime.requests import GenerationRequest  # noqa: E402
from kvbench.engines.kvengine.settings.config import EngineConfig  # noqa: E402

SETTINGS = [
    ("fp32", "tensor"),
    ("bf16", "tensor"),
    ("fp16", "tensor"),
    ("fp8_e4m3", "tensor"),
    ("fp8_e4m3", "channel"),
    ("fp8_e5m2", "tensor"),
    ("fp8_e5m2", "channel"),
]


def prompt(seed: int, length: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(1000, 30000, (length,), generator=generator).tolist())


def drain(engine: Engine) -> None:
    while engine.has_work():
        engine.step()


def prefill_tok_s(engine: Engine, length: int) -> float:
    engine.reset_prefix_cache()
    engine.add(GenerationRequest("prefill", prompt(0, length), 1, ignore_eos=True))
    started = time.perf_counter()
    drain(engine)
    return length / (time.perf_counter() - started)


def decode_tok_s(engine: Engine, batch: int, length: int, tokens: int) -> float:
    engine.reset_prefix_cache()
    for index in range(batch):
        engine.add(GenerationRequest(f"d{index}", prompt(index + 1, length), tokens, ignore_eos=True))
    # Run until every request has produced its first token (prefill done), then time the decode steps.
    produced = 0
    while produced < batch:
        produced += sum(
            1 for output in engine.step() if output.token_id is not None and output.request_id.startswith("d")
        )
    started = time.perf_counter()
    steps_tokens = 0
    while engine.has_work():
        steps_tokens += sum(1 for output in engine.step() if output.token_id is not None)
    return steps_tokens / (time.perf_counter() - started)


def bandwidth_table(loaded, threads: int) -> Table:
    """Copy and read bandwidth of a 1 GiB fp32 tensor (past the L3), best of 8, per wall second and per CPU second
    of the `threads` threads (process time / threads: on a loaded machine the wall figure counts the time other
    processes held the cores, the CPU figure does not)."""
    src = torch.ones(1 << 28)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch
    best = {"copy wall": 0.0, "copy cpu": 0.0, "read wall": 0.0, "read cpu": 0.0}
    for _ in range(8):
        for name, work, moved in (("copy", lambda: dst.copy_(src), 2 * src.nbytes), ("read", src.sum, src.nbytes)):
            wall, cpu = time.perf_counter(), time.process_time()
            work()
            wall, cpu = time.perf_counter() - wall, (time.process_time() - cpu) / threads
            best[f"{name} wall"] = max(best[f"{name} wall"], moved / wall / 1e9)
            best[f"{name} cpu"] = max(best[f"{name} cpu"], moved / cpu / 1e9)
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    table = Table(
        title=f"memory bandwidth ({threads} torch threads, GB/s; copy counts read + write) and the decode "
        f"floor of {loaded.folder.name}: its weights read once per step"
    )
    for column in (*best, "weights MB", "floor ms (wall read)", "floor ms (cpu read)"):
        table.add_column(column, justify="right")
    table.add_row(
        *(f"{v:.1f}" for v in best.values()),
        f"{weights / 1e6:.0f}",
        f"{weights / (best['read wall'] * 1e9) * 1e3:.1f}",
        f"{weights / (best['read cpu'] * 1e9) * 1e3:.1f}",
    )
    return table


def mixed_step_ms(loaded, model: str, batch: int, beside: int, steps: int = 8) -> tuple[float, float]:
    """Median ms of a pure decode step of `batch` sequences, and of one with `beside` prefill tokens beside."""
    engine = build_engine(
        EngineConfig(
            model=model,
            kv_capacity=16384,
            max_num_seqs=16,
            max_step_tokens=512,
            max_prefill_beside_decodes=max(beside, 1),
        ),
        loaded,
    )
    timings: list = []
    engine.step_listeners.append(timings.append)
    for index in range(batch):
        engine.add(GenerationRequest(f"d{index}", prompt(index + 1, 256), 4 * steps + 4, ignore_eos=True))
    while len(timings) < batch or any(end - start > 1 for start, end in timings[-1].work):
        engine.step()  # the prompts, until a step of decodes only
    timings.clear()
    for _ in range(steps):
        engine.step()
    pure = statistics.median(t.seconds for t in timings)
    if beside:
        engine.add(GenerationRequest("p", prompt(99, 512), 1, ignore_eos=True))
    timings.clear()
    for _ in range(steps):
        engine.step()
    # only the steps that computed a chunk beside the decodes: at 128 tokens the prompt is done in 4 of the 8
    # steps, and a median over all 8 averaged a pure step with a mixed one (177 ms read as "3.2x", not ~300 ms)
    mixed_steps = [t.seconds for t in timings if not beside or any(end - start > 1 for start, end in t.work)]
    mixed = statistics.median(mixed_steps)
    engine.close()
    return pure * 1e3, mixed * 1e3


# a neighbour busy `busy_s` then asleep, in a loop: what `--co-load` starts beside the replay
CO_LOAD = (
    "import time, sys\nbusy, idle = map(float, sys.argv[1:3])\nwhile True:\n    t = time.perf_counter()\n"
    "    while time.perf_counter() - t < busy: pass\n    time.sleep(idle)\n"
)
CO_LOAD_BURST_S = 0.0025


def load_replay(loaded, model: str, concurrency: int, step_tokens: int | None) -> dict[str, float]:
    """The served benchmark's load in process (see the module's doc); `step_tokens`: vLLM's budget, else ours."""
    budget = {} if step_tokens is None else {"max_step_tokens": step_tokens, "max_prefill_beside_decodes": step_tokens}
    engine = build_engine(EngineConfig(model=model, kv_capacity=8192, prefix_caching=False, **budget), loaded)
    engine.add(GenerationRequest("warm-up", prompt(NUM_PROMPTS, INPUT_LEN), 8, ignore_eos=True))
    drain(engine)
    added: dict[str, float] = {}
    tokens: dict[str, list[float]] = {}
    running = done = 0
    started = time.perf_counter()
    while done < NUM_PROMPTS:
        while running < concurrency and len(added) < NUM_PROMPTS:
            name = f"r{len(added)}"
            engine.add(GenerationRequest(name, prompt(len(added), INPUT_LEN), OUTPUT_LEN, ignore_eos=True))
            added[name], running = time.perf_counter(), running + 1
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            if output.token_id is not None:
                tokens.setdefault(output.request_id, []).append(now)
            if output.finished:
                running, done = running - 1, done + 1
    wall = time.perf_counter() - started
    engine.close()
    itl = np.concatenate([np.diff(tokens[name]) for name in added])
    return {
        "TTFT p50 ms": np.median([tokens[name][0] - at for name, at in added.items()]) * 1e3,
        "TPOT p50 ms": np.median([(t[-1] - t[0]) / (len(t) - 1) for t in map(tokens.get, added)]) * 1e3,
        "ITL p50 ms": np.median(itl) * 1e3,
        "ITL p99 ms": np.percentile(itl, 99) * 1e3,
        "out tok/s": NUM_PROMPTS * OUTPUT_LEN / wall,
    }


def load_table(loaded, model: str, concurrencies: list[int], vllm_budget: bool, co_load: float, threads: int) -> Table:
    step_tokens = VLLM_CPU_STEP_TOKENS if vllm_budget else None
    neighbour = None
    if co_load > 0:
        idle = CO_LOAD_BURST_S * (1 - co_load) / co_load
        neighbour = subprocess.Popen([sys.executable, "-c", CO_LOAD, str(CO_LOAD_BURST_S), str(idle)])
    try:
        rows = [(c, load_replay(loaded, model, c, step_tokens)) for c in concurrencies]
    finally:
        if neighbour is not None:
            neighbour.kill()
    budget = "vLLM's budget" if vllm_budget else "our default budget"
    table = Table(
        title=f"engine_vs_vllm's load in process: {NUM_PROMPTS} prompts of {INPUT_LEN} tokens, "
        f"{OUTPUT_LEN} out ({threads} torch threads, {budget}, a neighbour busy {co_load:.0%} "
        f"of a core)"
    )
    table.add_column("concurrency", justify="right")
    for column in rows[0][1]:
        table.add_column(column, justify="right")
    for concurrency, result in rows:
        table.add_row(str(concurrency), *(f"{v:,.1f}" for v in result.values()))
    return table


def mixed_table(loaded, model: str, batches: list[int], besides: list[int], threads: int) -> Table:
    table = Table(title=f"decode step beside a prompt's chunk ({threads} torch threads, {loaded.folder.name})")
    for column in ("batch", "prefill tokens beside", "pure decode ms", "mixed step ms", "ratio"):
        table.add_column(column, justify="right")
    for batch in batches:
        for beside in besides:
            pure, mixed = mixed_step_ms(loaded, model, batch, beside)
            table.add_row(str(batch), str(beside), f"{pure:.1f}", f"{mixed:.1f}", f"{mixed / pure:.2f}x")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--decode-prompt", type=int, default=256)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--formats",
        default=",".join(f"{d}/{s}" for d, s in SETTINGS),
        help="comma-separated kv_dtype/scale pairs to run (default: all)",
    )
    parser.add_argument("--batches", default="1,8", help="comma-separated decode batch sizes")
    parser.add_argument("--bandwidth", action="store_true", help="copy bandwidth and the decode floor")
    parser.add_argument(
        "--row-kernel-rows",
        type=int,
        default=None,
        help="steps of at most this many rows use our row kernel (default: the model's "
        "row_kernel_limit() where it is built; 0: torch's linears only)",
    )
    parser.add_argument(
        "--mixed",
        default=None,
        help="comma-separated prefill tokens beside the decodes (e.g. 0,16,32,64): the mixed table",
    )
    parser.add_argument("--load", default=None, help="comma-separated concurrencies: the load table")
    parser.add_argument("--vllm-budget", action="store_true", help="with --load: vLLM's step budget")
    parser.add_argument(
        "--co-load",
        type=float,
        default=0.0,
        help="with --load: a neighbour process busy this fraction of a core (0-0.9)",
    )
    args = parser.parse_args()
    if not 0 <= args.co_load <= 0.9:
        parser.error(f"--co-load {args.co_load}: give a fraction of a core from 0 to 0.9")
    if (args.vllm_budget or args.co_load) and not args.load:
        parser.error("--vllm-budget and --co-load apply to the load table: give --load too (e.g. --load 4)")
    concurrencies = []
    if args.load:
        try:
            concurrencies = [int(c) for c in args.load.split(",")]
        except ValueError:
            concurrencies = [0]
        if min(concurrencies) < 1:
            parser.error(f"--load {args.load!r}: give comma-separated concurrencies of at least 1, e.g. 1,4")
    settings = [tuple(item.split("/", 1)) if "/" in item else (item, "tensor") for item in args.formats.split(",")]
    unknown = [f"{d}/{s}" for d, s in settings if (d, s) not in SETTINGS]
    if unknown:
        parser.error(f"--formats: {', '.join(unknown)} unknown; use kv_dtype/scale pairs of {SETTINGS}")
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    if args.row_kernel_rows is not None:
        loaded.model.row_kernel_rows = args.row_kernel_rows
    if args.bandwidth:
        Console(width=160).print(bandwidth_table(loaded, args.threads))
        return
    if concurrencies:
        Console(width=160).print(
            load_table(loaded, args.model, concurrencies, args.vllm_budget, args.co_load, args.threads)
        )
        return
    if args.mixed:
        besides = [int(p) for p in args.mixed.split(",")]
        Console(width=160).print(mixed_table(loaded, args.model, batches, besides, args.threads))
        return
    table = Table(title=f"kvengine on this CPU ({args.threads} torch threads, fp32 compute, {loaded.folder.name})")
    for column in ("kv dtype", "scale", "bytes/token", "prefill tok/s", *(f"decode tok/s b={b}" for b in batches)):
        table.add_column(column, justify="right")
    for kv_dtype, scale in settings:
        engine = build_engine(
            EngineConfig(
                model=args.model,
                kv_dtype=kv_dtype,
                kv_scale=scale,
                kv_capacity=16384,
                max_num_seqs=16,
                max_step_tokens=512,
            ),
            loaded,
        )
        prefill = prefill_tok_s(engine, args.prompt)
        decode = [decode_tok_s(engine, b, args.decode_prompt, args.decode) for b in batches]
        table.add_row(
            kv_dtype,
            scale if engine.config.kv_format.quantized else "-",
            f"{engine.bytes_per_token:,}",
            f"{prefill:,.0f}",
            *(f"{d:,.1f}" for d in decode),
        )
        engine.close()
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
