"""Llama-family decoder (Llama, SmolLM2, Mistral without sliding window, Qwen2 with q/k/v bias) over paged KV.

Module and parameter names mirror Hugging Face's `LlamaForCausalLM`, so a checkpoint's state dict loads
as is (`load_hf_state_dict`) and tests can hand our weights to transformers as an oracle.

Tensor parallel (`parallel.TensorParallel`): a rank's modules have its local geometry (its heads, its part of
the MLP and of the vocabulary); it loads the matching slices of the checkpoint (`TensorParallel.cut`), and the
forward adds an all-reduce after o_proj and down_proj, a masked lookup + all-reduce for the embedding and an
all-gather of the logits. With one rank (`SINGLE`) every collective is the identity.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.engines.kvengine.model import cpu_kernels
from kvbench.engines.kvengine.model.attention import AttentionBackend, VarlenAttention
from kvbench.engines.kvengine.model.batch import ForwardBatch
from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.kv_cache import PagedKVCache
from kvbench.engines.kvengine.model.parallel import SINGLE, TensorParallel


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 whatever the compute dtype, as the reference implementation does: x * rsqrt(mean(x^2)
        # + eps), in torch's fused kernel (the same fp32 values as those three ops here, in one call instead of
        # four: ~17 against ~26 us a call at 1-40 rows, 61 calls a SmolLM2 step)
        h = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(config: ModelConfig, device: torch.device) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], with llama3 scaling when the config asks for it."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    s = config.rope_scaling
    if s is None:
        return inv
    # llama3: long wavelengths slowed down by `factor`, short ones kept, a smooth blend in between
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * inv / s.factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(mid, blended, out)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, D]; cos/sin [n, D] (halves layout, as in HF checkpoints). On a CPU in fp32, the same operations
    in one pass of our kernel (`cpu_kernels.rope`, bit-equal): torch's five (chunk, cat, two products, a sum) took
    73 ms of a 2.6 s prefill step of 4 x 512 tokens, and ~70 us a layer at a decode step's few rows."""
    if x.device.type == "cpu":
        out = cpu_kernels.rope(x, cos, sin, torch.get_num_threads())
        if out is not None:
            return out
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the fused gate-up output [n, 2 * width] (gate, then up). On a CPU in fp32, one pass of
    our kernel (`cpu_kernels.silu_mul`, within fp32 rounding of torch's two operations and their two new tensors)."""
    if gate_up.device.type == "cpu":
        out = cpu_kernels.silu_mul(gate_up, torch.get_num_threads())
        if out is not None:
            return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        bias = c.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.qkv_sizes = (self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features)
        self.fuse()

    def fuse(self) -> None:
        self.qkv_weight, self.qkv_bias = fuse_linears(self.q_proj, self.k_proj, self.v_proj)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.fuse()

    def fuse(self) -> None:
        self.gate_up_weight, _ = fuse_linears(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(F.linear(x, self.gate_up_weight)))


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None, threads: int = 0
) -> torch.Tensor:
    """x @ weight.T + bias: in our row kernel with `threads` threads where given (`row_kernel_rows`), else through
    `packed` (the same weight prepacked by oneDNN, see `prepack`) where given, else F.linear."""
    if threads:
        out = cpu_kernels.linear_rows(x, weight, bias, threads)
        if out is not None:
            return out
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def can_prepack(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether oneDNN-prepacked linear weights are available: fp32 on a CPU whose torch has oneDNN."""
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) tensor holding the linears' rows in order, each linear's parameters becoming a view
    of its rows: one matmul instead of several, no extra memory, and the Hugging Face names and state dict
    unchanged (in-place writes to a parameter reach the fused tensor; a parameter replaced needs a new fuse)."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([linear.bias.detach() for linear in linears]) if has_bias else None
    start = 0
    for linear in linears:
        rows = slice(start, start + linear.out_features)
        linear.weight = nn.Parameter(weight[rows], requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias[rows], requires_grad=False)
        start = rows.stop
    return weight, bias


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig, vocab_rows: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_rows, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder; `forward(batch, kv_cache)` writes the new tokens' K/V and returns fp32 logits.

    `config` is the model's; `self.config` is what this rank computes (`parallel.local_config(config)`, the
    same with one rank), which is the geometry its KV cache takes."""

    def __init__(
        self, config: ModelConfig, attention: AttentionBackend | None = None, parallel: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        self.full_config = config
        self.parallel = parallel
        self.config = parallel.local_config(config)
        self.attention: AttentionBackend = attention or VarlenAttention()
        rows = parallel.vocab_rows(config)
        self.model = Backbone(self.config, rows)
        self.lm_head = nn.Linear(config.hidden_size, rows, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # oneDNN-prepacked copies of the linear weights, per layer (qkv, o, gate_up, down), then the LM head;
        # used for steps of more than one row (`prepack`); None: plain F.linear everywhere
        self.prepacked: tuple[tuple[torch.Tensor, ...], ...] | None = None
        self.prepacked_min_rows = 2  # steps of fewer rows use plain F.linear (set by `prepack`)
        # steps of at most this many rows use our row kernel (set again by `fuse`, after a move or a dtype change)
        self.row_kernel_rows = row_kernel_rows(self.lm_head.weight)

    def prepack(self, rows_hint: int = 8) -> int:
        """Keep oneDNN-prepacked copies of every linear weight (fp32 on CPU only, `can_prepack`), used by steps of
        more than one row, where they paid on a 2-core AVX-512 CPU (CPU time of the layers' matmuls, batch 4:
        -24%, batch 8: -14%; batch 1 was faster unpacked there), and for one row too where torch's kernels are
        AVX2 (`prepacked_min_rows`). They copy the weights as they are now
        (a later in-place change to a parameter does not reach them; `fuse` drops them). Returns the bytes
        they take (about the linear weights' own), 0 where not available."""
        weight = self.lm_head.weight
        if not can_prepack(weight.device, weight.dtype):
            return 0
        pack = torch.ops.mkldnn._reorder_linear_weight
        layers = tuple(
            (
                pack(layer.self_attn.qkv_weight, rows_hint),
                pack(layer.self_attn.o_proj.weight, rows_hint),
                pack(layer.mlp.gate_up_weight, rows_hint),
                pack(layer.mlp.down_proj.weight, rows_hint),
            )
            for layer in self.model.layers
        )
        self.prepacked = layers + ((pack(weight, rows_hint),),)
        self.prepacked_min_rows = prepacked_min_rows()
        return prepacked_bytes(self)

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face-named weights, this rank's slices of them (`TensorParallel.shard_state_dict`, or a
        loader that reads only those); strict: a missing or unexpected tensor is an error."""
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        if self.config.tie_word_embeddings:
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        result = self.load_state_dict(state, strict=False, assign=True)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"checkpoint does not match config.json: missing {result.missing_keys[:5]}, "
                f"unexpected {result.unexpected_keys[:5]}"
            )
        if self.config.tie_word_embeddings:  # assign=True replaced the shared Parameter: tie again
            self.lm_head.weight = self.model.embed_tokens.weight
        self.fuse()

    def fuse(self) -> None:
        """Fuse every layer's q/k/v and gate/up projections again (`fuse_linears`), after their parameters were
        replaced (a state dict assigned, a move to another device or dtype)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        self.prepacked = None
        self.row_kernel_rows = row_kernel_rows(self.lm_head.weight)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        """`.to()`, `.cuda()`, `.half()`: each parameter is converted on its own, so the fused tensors are
        rebuilt from the converted ones (and the unconverted copies freed)."""
        super()._apply(fn, recurse)
        self.fuse()
        return self

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_cache: PagedKVCache) -> torch.Tensor:
        """Run the batch's new tokens; returns logits [len(batch.logit_rows), vocab] in fp32."""
        c = self.config
        if kv_cache.page_size != batch.page_size:
            raise ValueError(f"batch.page_size={batch.page_size} != kv_cache.page_size={kv_cache.page_size}")
        if kv_cache.compute_dtype != self.lm_head.weight.dtype:
            raise ValueError(
                f"kv_cache.compute_dtype={kv_cache.compute_dtype} must equal the model dtype "
                f"{self.lm_head.weight.dtype}: build PagedKVCache(..., compute_dtype=model dtype)"
            )
        prepared = self.attention.prepare(batch)
        freqs = batch.positions[:, None].float() * rope_inv_freq(c, batch.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        tp = self.parallel
        h = tp.embed(self.model.embed_tokens.weight, batch.input_ids, self.full_config)
        cos, sin = emb.cos().to(h.dtype), emb.sin().to(h.dtype)
        n = h.shape[0]
        packed = self.prepacked if n >= self.prepacked_min_rows else None  # see `prepack`
        threads = torch.get_num_threads() if n <= self.row_kernel_rows else 0  # see `row_kernel_rows`
        for i, layer in enumerate(self.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv_p, o_p, gate_up_p, down_p = packed[i] if packed else (None,) * 4
            x = layer.input_layernorm(h)
            q, k, v = linear(x, attn.qkv_weight, attn.qkv_bias, qkv_p, threads).split(attn.qkv_sizes, dim=-1)
            q = apply_rope(q.view(n, c.num_heads, c.head_dim), cos, sin)
            k = apply_rope(k.view(n, c.num_kv_heads, c.head_dim), cos, sin)
            v = v.view(n, c.num_kv_heads, c.head_dim)
            kv_cache.write(i, batch.slot_mapping, k, v)  # first write, then read back through the pages
            o = self.attention(q, kv_cache, i, prepared)
            h = h + tp.all_reduce(linear(o.reshape(n, -1), attn.o_proj.weight, None, o_p, threads))
            x = layer.post_attention_layernorm(h)
            act = silu_and_mul(linear(x, mlp.gate_up_weight, None, gate_up_p, threads))
            h = h + tp.all_reduce(linear(act, mlp.down_proj.weight, None, down_p, threads))
        h = self.model.norm(h[batch.logit_rows])
        head_p = packed[-1][0] if packed and h.shape[0] >= self.prepacked_min_rows else None
        logits = linear(h, self.lm_head.weight, None, head_p, threads if h.shape[0] <= ROW_KERNEL_HEAD_ROWS else 0)
        return tp.gather_vocab(logits, self.full_config).float()


# The most rows a step sends through our row kernel (`cpu_kernels.linear_rows`), per torch's CPU capability (what
# oneDNN's kernels use), and the LM head's own limit. GB/s of weights read, each weight streamed from memory
# (kernel / oneDNN prepacked / F.linear, `benchmarks/linear_rows.py`), 2 cores:
# - AVX2: gate_up [3072, 576] 1 row 17.2 / 15.4 / 9.3, 4 rows 13.2 / 11.0 / 4.9, 8 rows 10.3 / 9.5 / 5.9; down
#   [576, 1536] 1 row 17.9 / 12.1 / 12.6, 8 rows 11.1 / 9.2 / 6.4; the LM head [49152, 576] 1 row 18.3 / 16.4 /
#   8.7, 2 rows 16.8 / 15.6, 4 rows 13.5 / 13.8, 8 rows 9.9 / 11.3.
# - AVX-512 (an EPYC): gate_up 1 row 21.8 / 18.9 / 11.6, 2 rows 17.0 / 15.0 / 5.3, 4 rows 14.7 / 19.2 / 7.4,
#   8 rows 12.1 / 19.3 / 5.5; down 2 rows 19.3 / 17.6, 4 rows 15.1 / 17.8; the LM head 2 rows 19.5 / 17.6, 4 rows
#   16.3 / 24.0. Decode, kernel up to 8 rows against up to 2 (`benchmarks/engine_bench.py`, rounds alternated):
#   batch 4 49.6 / 54.2 / 49.8 against 56.0 / 57.6 / 57.4 tok/s; batch 8 51.8 / 52.4 / 55.5 against 58.4 / 59.0 /
#   55.1 (the third round even); `--load 4 --vllm-budget` (four streams decoding together) TPOT p50 53.9 / 47.9
#   against 42.1 / 43.8 ms.
ROW_KERNEL_ROWS = {"AVX2": 8, "AVX512": 2}
ROW_KERNEL_HEAD_ROWS = 2


def row_kernel_limit() -> int:
    """ROW_KERNEL_ROWS for this CPU's torch capability (AVX2's where it is another: the kernel itself needs AVX2)."""
    return ROW_KERNEL_ROWS.get(torch.backends.cpu.get_cpu_capability(), ROW_KERNEL_ROWS["AVX2"])


def row_kernel_rows(weight: torch.Tensor) -> int:
    """How many rows a step may have to go through our row kernel: `row_kernel_limit()` for fp32 weights on a CPU
    where the kernel is built with its AVX2+FMA path (`cpu_kernels.has_linear_rows`), else 0 (torch's linears only)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not cpu_kernels.has_linear_rows():
        return 0
    return row_kernel_limit()


def prepacked_min_rows() -> int:
    """The fewest rows a step needs to go through the prepacked weights: 1 where torch's CPU kernels are AVX2
    (a one-row SmolLM2-135M decode step, 2 cores: 57.0 -> 52.4 ms and 58.2 -> 53.7 ms, the two paths
    alternated, `benchmarks/engine_bench.py`), else 2 (on AVX-512 one row was faster unpacked: 40.9 against
    54.8 ms of the layers' matmuls)."""
    return 1 if torch.backends.cpu.get_cpu_capability() == "AVX2" else 2


def prepacked_bytes(model: LlamaForCausalLM) -> int:
    """What `model.prepack()` keeps: one more copy of every linear weight, the LM head's included (its rows on
    this rank), in the weights' dtype (fp32 on the CPU where it applies). Counted by the memory budget."""
    c, head = model.config, model.lm_head.weight
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    per_layer = sum(t.numel() for t in (attn.qkv_weight, attn.o_proj.weight, mlp.gate_up_weight, mlp.down_proj.weight))
    return (c.num_layers * per_layer + head.numel()) * head.element_size()
