"""Where a served step goes: py-spy's raw stacks of `kvbench serve` (from `engine_vs_vllm.py --profile DIR`)
split into model work and the rest, as shares of every sample taken while a thread was busy.

    python benchmarks/step_split.py DIR/kvbench-c4.txt [more files ...]

A sample counts for the first part whose frame its stack holds, deepest first: the engine thread's model
(linear layers, MLP, norms, RoPE: `model`), KV gather, attention, KV write, sampling, batch build, the
scheduler, the rest of the step (tiers, metrics), the hand-off between the engine thread and the event loop;
the event loop's detokenising, SSE writes and the rest of HTTP. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

# (part, frames that mark it), checked in this order against each stack's frames from the deepest up
PARTS = (
    ("KV gather", ("PagedKVCache.gather", "VarlenAttention.prepare", "lut_decode")),
    ("KV write", ("PagedKVCache.write",)),
    (
        "attention",
        (
            "VarlenAttention.attend",
            "VarlenAttention.__call__",
            "scaled_dot_product_attention",
            "CpuPagedAttention",
            "decode_attention",
        ),
    ),
    ("sampling", ("sample (", "token_logprobs", "_inverse_cdf")),
    ("batch build", ("ForwardBatch.build", "chunks_of", "SequenceChunk")),
    ("model", ("LlamaForCausalLM.forward", "ModelRunner.execute", "FusedLinear")),
    ("scheduler", ("Scheduler.", "CompactSteps.")),
    ("detokenise", ("TextStream", "tokenizers", "_decode (", "decode (transformers")),
    ("SSE write", ("StreamResponse.write", "StreamWriter", "_SelectorSocketTransport.write", "sse")),
    (
        "hand-off",
        (
            "call_soon_threadsafe",
            "_write_to_self",
            "Queue.get",
            "Queue.put",
            "AsyncEngine.",
            "run_coroutine_threadsafe",
            "Future.set_result",
        ),
    ),
    ("rest of step", ("Engine.",)),
)


def part_of(stack: str) -> str:
    frames = stack.split(";")[::-1]
    for frame in frames:
        for part, marks in PARTS:
            if any(mark in frame for mark in marks):
                return part
    return "HTTP / other" if "aiohttp" in stack or "asyncio" in stack else "other"


def split(path: Path) -> Counter:
    counts: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            counts[part_of(stack)] += int(n)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    splits = {path: split(path) for path in args.files}
    parts = [p for p, _ in PARTS] + ["HTTP / other", "other"]
    table = Table(title="kvbench serve under load: share of busy samples (py-spy, every thread)")
    table.add_column("part")
    for path in splits:
        table.add_column(f"{path.parent.name}/{path.name}", justify="right")
    for part in parts:
        if any(counts[part] for counts in splits.values()):
            table.add_row(part, *(f"{100 * c[part] / max(1, sum(c.values())):.1f}%" for c in splits.values()))
    table.add_row("samples", *(f"{sum(c.values()):,}" for c in splits.values()))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
