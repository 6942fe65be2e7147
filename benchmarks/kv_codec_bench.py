"""FP8 KV codec throughput next to a plain copy, and bytes per cached token per KV format.

    python benchmarks/kv_codec_bench.py [--tokens 65536] [--repeats 5] [--device cpu] [--threads 1]

Throughput counts the fp32 (compute dtype) bytes on the wide side of the codec: bytes read by encode,
bytes written by decode, and bytes copied by the reference `dst.copy_(src)` of an fp32 tensor of the same
shape. Every side writes into preallocated outputs, as the engine's reads do (`PagedKVCache.gather` fills
buffers allocated once per forward): a fresh 25 MB output per call costs its page faults, which the copy
does not pay. Target: codec >= 50% of copy bandwidth. `KVBENCH_CPU_CODEC=0` measures torch's path instead of
the C kernel (`cpu_kernels`). Geometry: one SmolLM2-135M layer (3 KV heads x 64).
"""

from __future__ import annotations

import argparse
import time

import torch

from kvbench.engines.kvengine.core.kv_format import SCALE_MODES, KVDtype, KVFormat
from kvbench.engines.kvengine.model import cpu_kernels, fp8
from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache

SMOLLM2 = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
)
ALL_FORMATS = [KVFormat.parse(dtype.value) for dtype in KVDtype if not dtype.quantized] + [
    KVFormat.parse(dtype.value, mode) for dtype in KVDtype if dtype.quantized for mode in SCALE_MODES
]


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def codec_table(tokens: int, repeats: int, device: str) -> None:
    c = SMOLLM2
    x = torch.randn(tokens, c.num_kv_heads, c.head_dim, device=device)
    nbytes = x.numel() * x.element_size()
    dst = torch.empty_like(x)
    copy_gbs = nbytes / best_seconds(lambda: dst.copy_(x), repeats) / 1e9
    path = "C kernel (cpu_kernels)" if device == "cpu" and cpu_kernels.library() else "torch"
    print(
        f"{tokens} tokens x {c.num_kv_heads} heads x {c.head_dim} = {nbytes / 1e6:.1f} MB fp32 per pass, "
        f"best of {repeats}, device {device}, {torch.get_num_threads()} thread(s), codec: {path} "
        f"(channel encode: the shift in torch, then {path})"
    )
    print(f"{'format':<22}{'encode GB/s':>12}{'decode GB/s':>12}{'copy GB/s':>11}{'enc/copy':>10}{'dec/copy':>10}")
    for fmt in (f for f in ALL_FORMATS if f.quantized):
        shape = fmt.scale_shape(c.num_kv_heads, c.head_dim)
        scale = torch.full(shape, 0.05, device=device)
        payload, shift = fp8.encode(fmt, x, scale)
        encoded = (torch.empty_like(payload), None if shift is None else torch.empty_like(shift))
        enc = nbytes / best_seconds(lambda: fp8.encode(fmt, x, scale, out=encoded), repeats) / 1e9
        dec = (
            nbytes / best_seconds(lambda: fp8.decode(fmt, payload, shift, scale, torch.float32, out=dst), repeats) / 1e9
        )
        print(f"{fmt.label:<22}{enc:>12.2f}{dec:>12.2f}{copy_gbs:>11.2f}{enc / copy_gbs:>9.0%}{dec / copy_gbs:>10.0%}")


def bytes_table() -> None:
    print("\nbytes per cached token, SmolLM2-135M (30 layers x 3 KV heads x 64, K and V)")
    print(f"{'format':<22}{'bytes/token':>12}{'vs bf16':>9}{'tokens per GiB':>16}")
    bf16 = PagedKVCache(SMOLLM2, 1, 16, KVFormat(KVDtype.BF16)).bytes_per_token
    for fmt in ALL_FORMATS:
        bpt = PagedKVCache(SMOLLM2, 1, 16, fmt).bytes_per_token
        print(f"{fmt.label:<22}{bpt:>12}{bpt / bf16:>9.3f}{2**30 // bpt:>16}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    codec_table(args.tokens, args.repeats, args.device)
    bytes_table()


if __name__ == "__main__":
    main()
