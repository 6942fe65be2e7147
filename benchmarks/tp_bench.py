"""Tensor parallel on this CPU: the engine's step time at TP=2 (two ranks, one torch thread each; collectives
through shared memory, gloo for large tensors) against TP=1 (one process, two torch threads), on the same two
cores.

    python benchmarks/tp_bench.py [--prompt 512] [--prefills 3] [--decode-steps 24]

The model is SmolLM2-135M-sized with random weights (12 query heads, 4 KV heads, so that it splits in two;
SmolLM2's own 9 heads / 3 KV heads do not), written once as a safetensors folder with SmolLM2's tokenizer, so
that every rank reads only its shard from disk as a real checkpoint would be read. Step times are the engine's
own (`Engine.step_listeners`: scheduling to the last gauge), the median over the steps of each phase:

    prefill   --prefills prompts of --prompt tokens, one after another, each in one step (max_step_tokens)
    decode bN N requests (prompts of 256 tokens, already computed) generating one token each per step

This is a benchmark (it prints a table), not a test. The target of issue 15: TP=2 within 1.5x of TP=1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from kvbench.engines.kvengine.model.config import ModelConfig  # noqa: E402
from kvbench.engines.kvengine.model.tiny import tiny_model  # noqa: E402
from kvbench.engines.kvengine.model.weights import cache_root, resolve_source  # noqa: E402
from kvbench.engines.kvengine.runtime.budget_probe import build_engine  # noqa: E402
from kvbench.engines.kvengine.runtime.engine import Engine  # noqa: E402
from kvbench.engines.kvengine.runtime.requests import GenerationRequest  # noqa: E402
from kvbench.engines.kvengine.server.ranks import RankProcesses  # noqa: E402
from kvbench.engines.kvengine.settings.config import EngineConfig  # noqa: E402

BENCH_MODEL = ModelConfig(
    vocab_size=49152,
    hidden_size=768,
    intermediate_size=2048,
    num_layers=12,
    num_heads=12,
    num_kv_heads=4,
    head_dim=64,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def bench_folder() -> Path:
    """The random-weight checkpoint, written once (atomically) next to the converted models."""
    folder = cache_root() / "tp-bench-random-113m"
    if (folder / "config.json").is_file():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in tiny_model(0, BENCH_MODEL).state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(BENCH_MODEL.to_hf_dict()))
    source = resolve_source("default")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, tmp / name)
    tmp.rename(folder)
    return folder


def prompt(seed: int, length: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(1000, 30000, (length,), generator=generator).tolist())


def step_times(engine: Engine, requests: list[GenerationRequest], skip_first: int = 0) -> list[float]:
    """Seconds of the steps after the first `skip_first` (prefill of a decode batch), run to the end."""
    seconds: list[float] = []
    engine.step_listeners.append(lambda timing: seconds.append(timing.seconds))
    engine.reset_prefix_cache()
    for request in requests:
        engine.add(request)
    while engine.has_work():
        engine.step()
    engine.step_listeners.pop()
    return seconds[skip_first:]


def measure(engine: Engine, args: argparse.Namespace) -> dict[str, float]:
    prefills = [
        seconds
        for i in range(args.prefills)
        for seconds in step_times(
            engine, [GenerationRequest(f"p{i}", prompt(100 + i, args.prompt), 1, ignore_eos=True)]
        )
    ]
    out = {"prefill": statistics.median(prefills)}
    for batch in (1, 8):
        requests = [
            GenerationRequest(f"d{i}", prompt(i + 1, 256), args.decode_steps, ignore_eos=True) for i in range(batch)
        ]
        # prefill of the batch takes ceil(256 * batch / max_step_tokens) steps; the decode steps follow
        out[f"decode b{batch}"] = statistics.median(step_times(engine, requests, -(-256 * batch // args.prompt) + 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--prefills", type=int, default=3)
    parser.add_argument("--decode-steps", type=int, default=24)
    args = parser.parse_args()
    folder = bench_folder()
    settings = {"model": str(folder), "kv_capacity": 8192, "max_step_tokens": args.prompt, "max_num_seqs": 8}
    torch.set_num_threads(2)
    single = measure(build_engine(EngineConfig(**settings, threads=2)), args)
    torch.set_num_threads(1)
    config = EngineConfig(**settings, threads=1, tensor_parallel_size=2)
    workers = RankProcesses(config)
    died: list[tuple[int, int, int]] = []
    try:
        sharded = measure(build_engine(config, ranks=workers.start(on_exit=lambda *exit_: died.append(exit_))), args)
    finally:
        workers.close()
        dist.destroy_process_group()
    if died:
        raise SystemExit(f"a worker rank died: {died}")
    load = os.getloadavg()
    table = Table(
        title=f"kvengine step time: TP=2 (2 ranks x 1 thread, shared memory) vs TP=1 (1 process, 2 threads)\n"
        f"{folder.name}, fp32, {os.cpu_count()} cores, load average after the run "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    for column in ("step", "TP=1 ms", "TP=2 ms", "TP=2 / TP=1"):
        table.add_column(column, justify="right")
    for name, seconds in single.items():
        table.add_row(name, f"{seconds * 1e3:.1f}", f"{sharded[name] * 1e3:.1f}", f"{sharded[name] / seconds:.2f}x")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
