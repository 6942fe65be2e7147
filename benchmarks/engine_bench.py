"""Our engine on this machine, per KV dtype: prefill tok/s, decode tok/s at batch 1 and 8, bytes per token.

    python benchmarks/engine_bench.py [--model default] [--prompt 1024] [--decode 32] [--threads 2]
                                      [--formats fp32,fp8_e4m3/tensor] [--batches 1,8]

Prefill: one 1,024-token prompt, computed in chunks of the step budget, timed to its first token. Decode:
B requests whose prompts are already computed, generating `--decode` tokens each; tokens/s counts all of them.
This is a benchmark (it prints a table), not a test.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kvbench.engines.kvengine.config import EngineConfig  # noqa: E402
from kvbench.engines.kvengine.model.loader import load_model  # noqa: E402
from kvbench.engines.kvengine.runtime.engine import Engine  # noqa: E402
from kvbench.engines.kvengine.runtime.requests import GenerationRequest  # noqa: E402

SETTINGS = [("fp32", "tensor"), ("bf16", "tensor"), ("fp16", "tensor"), ("fp8_e4m3", "tensor"),
            ("fp8_e4m3", "channel"), ("fp8_e5m2", "tensor"), ("fp8_e5m2", "channel")]


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
        produced += sum(1 for output in engine.step() if output.token_id is not None and output.request_id.startswith("d"))
    started = time.perf_counter()
    steps_tokens = 0
    while engine.has_work():
        steps_tokens += sum(1 for output in engine.step() if output.token_id is not None)
    return steps_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--decode-prompt", type=int, default=256)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--formats", default=",".join(f"{d}/{s}" for d, s in SETTINGS),
                        help="comma-separated kv_dtype/scale pairs to run (default: all)")
    parser.add_argument("--batches", default="1,8", help="comma-separated decode batch sizes")
    args = parser.parse_args()
    settings = [tuple(item.split("/", 1)) if "/" in item else (item, "tensor") for item in args.formats.split(",")]
    unknown = [f"{d}/{s}" for d, s in settings if (d, s) not in SETTINGS]
    if unknown:
        parser.error(f"--formats: {', '.join(unknown)} unknown; use kv_dtype/scale pairs of {SETTINGS}")
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    table = Table(title=f"kvengine on this CPU ({args.threads} torch threads, fp32 compute, {loaded.folder.name})")
    for column in ("kv dtype", "scale", "bytes/token", "prefill tok/s", *(f"decode tok/s b={b}" for b in batches)):
        table.add_column(column, justify="right")
    for kv_dtype, scale in settings:
        engine = Engine(EngineConfig(model=args.model, kv_dtype=kv_dtype, kv_scale=scale, kv_capacity=16384,
                                     max_num_seqs=16, max_step_tokens=512), loaded)
        prefill = prefill_tok_s(engine, args.prompt)
        decode = [decode_tok_s(engine, b, args.decode_prompt, args.decode) for b in batches]
        table.add_row(kv_dtype, scale if engine.config.kv_format.quantized else "-", f"{engine.bytes_per_token:,}",
                      f"{prefill:,.0f}", *(f"{d:,.1f}" for d in decode))
        engine.close()
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
