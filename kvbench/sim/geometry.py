"""Model geometry for the simulator: KV bytes per token, FLOPs per token and weight bytes, from a config.json.

Read from Hugging Face style `config.json` files (the ones shipped in `kvbench/sim/models/`, or any path).
Covers dense GQA models (Llama, Qwen2, Mistral), sparse MoE (Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss),
multi-head latent attention (DeepSeek-V3: one compressed latent of `kv_lora_rank` plus a shared rope key of
`qk_rope_head_dim` per token and layer, instead of K and V per KV head), sliding-window layers beside full
ones (gpt-oss: `layer_types` alternates sliding_attention / full_attention, `sliding_window` 128) and
quantized checkpoints (`quantization_config`: fp8 linear layers, mxfp4 experts; embeddings, lm_head and the
modules the config leaves unconverted stay bf16, as vLLM loads them).

Counting rules (what "per token" means here):

    KV bytes/token    GQA: kv layers * 2 (K and V) * kv_heads * head_dim * dtype bytes
                      MLA: kv layers * (kv_lora_rank + qk_rope_head_dim) * dtype bytes
                      kv layers: the full-attention layers, whose KV grows with the context. A sliding layer
                      keeps at most `sliding_window` tokens a sequence (`window_kv_bytes`): vLLM's hybrid
                      allocator gives the sliding group its own blocks, freed as the window moves, from the
                      same pool, so a pool token costs one group's layers (gpt-oss: 18 of 36). A model with
                      only sliding layers counts them all (one group, sized per token like full layers).
    params            embeddings + lm_head (unless tied) + attention projections + MLPs (all experts)
    active params     the same with only top-k routed experts (+ shared experts) per MoE layer
    weight bytes      each part at its stored dtype (`WeightDtypes`); mxfp4 is 4 bits + one e8m0 scale per 32
    linear FLOPs      2 * (active params - input embedding) per token (a lookup costs no FLOPs)
    attention FLOPs   4 * heads * head_dim_qk_v per token and attended token (QK^T and AV): full layers
                      attend the whole context, sliding layers at most their window

Norms, biases, rotary and routers' softmax are ignored (well under 1% of each count).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.engines.kvengine.core.kv_format import KVDtype

MODELS_DIR = Path(__file__).with_name("models")

# Bytes per stored element of the dtypes the simulator may be asked about: our engine's KV dtypes
# (`core.kv_format.KVDtype`, the owner of those names) plus the names other engines use for KV and weight
# dtypes, for models and engines we simulate but do not run (vLLM's and SGLang's --kv-cache-dtype `auto`,
# `fp8`, `int8`; torch's weight dtype names; 4-bit weights). A strict superset: our engine's names mean the same.
OTHER_ENGINES_DTYPE_BYTES: Mapping[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "auto": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
    "mxfp4": 4.25 / 8,  # OCP microscaling: 4-bit e2m1 values, one 8-bit e8m0 scale per block of 32
}
DTYPE_BYTES: Mapping[str, float] = {
    **{dtype.value: dtype.bytes_per_element for dtype in KVDtype},
    **OTHER_ENGINES_DTYPE_BYTES,
}


class ModelConfigError(ValueError):
    """A model name or config.json that cannot be used; the message names the field and the fix."""


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a KV or weight dtype name (`fp16`, `bf16`, `fp8_e4m3`, ...)."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ModelConfigError(f"dtype {dtype!r} is unknown: use one of {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True, slots=True)
class Mla:
    """Multi-head latent attention sizes (DeepSeek-V2/V3)."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True)
class Moe:
    """Sparse MLP: `num_layers` of the model's layers route each token to `top_k` of `num_experts` experts."""

    num_layers: int
    num_experts: int
    top_k: int
    expert_intermediate: int
    shared_experts: int = 0


@dataclass(frozen=True, slots=True)
class WeightDtypes:
    """The stored dtype of each part of a checkpoint. A quantized checkpoint converts its linear layers and
    keeps the embeddings and lm_head in bf16 (fp8 and mxfp4 checkpoints list them in modules_to_not_convert);
    gpt-oss also keeps attention and the routers in bf16 and stores only the experts in mxfp4."""

    attention: str = "bf16"
    mlp: str = "bf16"  # dense MLPs and shared experts
    experts: str = "bf16"  # routed experts
    embeddings: str = "bf16"  # input embedding and lm_head

    @classmethod
    def uniform(cls, dtype: str) -> WeightDtypes:
        """Every linear layer in `dtype` (an engine's online quantization: vLLM's --quantization fp8)."""
        return cls(dtype, dtype, dtype, "bf16" if dtype_bytes(dtype) < 2 else dtype)

    @property
    def compute(self) -> str:
        """The dtype most of a step's matmul FLOPs run in: the experts' for MoE, else the dense layers'."""
        return self.mlp


SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (dense layers only, for MoE models)
    vocab_size: int
    tie_word_embeddings: bool = False
    moe: Moe | None = None
    mla: Mla | None = None
    weight_dtype: str = "bf16"  # the checkpoint's main weight dtype (its dense linear layers)
    weights: WeightDtypes | None = None  # per part; None: every part in weight_dtype (embeddings bf16 when < 2 B)
    sliding_window: int | None = None  # tokens a sliding layer attends (None: no sliding layers)
    sliding_layers: int = 0  # how many of num_layers attend only their window

    def __post_init__(self) -> None:
        if not 0 <= self.sliding_layers <= self.num_layers or (self.sliding_layers and not self.sliding_window):
            raise ModelConfigError(
                f"{self.name}: {self.sliding_layers} sliding layers of {self.num_layers} need a "
                "sliding_window >= 1 (config.json's sliding_window)"
            )

    # ---- KV ----------------------------------------------------------------------------------------------
    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers

    @property
    def kv_layers(self) -> int:
        """Layers whose KV a pool token pays for (module docstring): the full ones, or all when none is full."""
        return self.full_layers or self.num_layers

    @property
    def _kv_elements_per_layer(self) -> int:
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_elements_per_token(self) -> int:
        """Stored KV elements per pool token, over the layers that pay for it (`kv_layers`)."""
        return self.kv_layers * self._kv_elements_per_layer

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        return self.kv_elements_per_token * dtype_bytes(kv_dtype)

    def window_kv_bytes(self, kv_dtype: str, context: int) -> float:
        """KV bytes a sequence of `context` tokens keeps in its sliding layers beyond `kv_bytes_per_token`'s
        count (0 without a full layer: then the sliding layers are the per-token count)."""
        if not self.sliding_layers or not self.full_layers:
            return 0.0
        return (
            self.sliding_layers
            * self._kv_elements_per_layer
            * min(context, self.sliding_window)
            * dtype_bytes(kv_dtype)
        )

    def kv_bytes(self, kv_dtype: str, context: int) -> float:
        """All the KV one sequence of `context` tokens stores."""
        return self.kv_bytes_per_token(kv_dtype) * context + self.window_kv_bytes(kv_dtype, context)

    # ---- parameters --------------------------------------------------------------------------------------
    def _attention_params(self) -> int:
        h, heads = self.hidden_size, self.num_heads
        if self.mla is None:
            d = self.head_dim
            return h * heads * d + 2 * h * self.num_kv_heads * d + heads * d * h
        m = self.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = h * heads * qk if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank * heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + heads * m.v_head_dim * h

    def _dense_mlp_params(self) -> int:
        """Dense MLPs, shared experts and routers: the MLP parameters every token passes through."""
        h = self.hidden_size
        total = (self.num_layers - (self.moe.num_layers if self.moe else 0)) * 3 * h * self.intermediate_size
        if self.moe is not None:
            m = self.moe
            total += m.num_layers * (m.shared_experts * 3 * h * m.expert_intermediate + h * m.num_experts)
        return total

    def _expert_params(self, active: bool) -> int:
        if self.moe is None:
            return 0
        m = self.moe
        return m.num_layers * (m.top_k if active else m.num_experts) * 3 * self.hidden_size * m.expert_intermediate

    def _mlp_params(self, active: bool) -> int:
        return self._dense_mlp_params() + self._expert_params(active)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size  # shared storage when tied, but always computed

    @property
    def num_params(self) -> int:
        """Stored parameters (all experts)."""
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + head + self.num_layers * self._attention_params() + self._mlp_params(False)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (top-k experts only), the input embedding excluded."""
        return self.lm_head_params + self.num_layers * self._attention_params() + self._mlp_params(True)

    def weight_dtypes(self, weight_dtype: str | None = None) -> WeightDtypes:
        """Each part's stored dtype: the checkpoint's, or every linear layer in `weight_dtype` when given."""
        if weight_dtype is not None:
            return WeightDtypes.uniform(weight_dtype)
        return self.weights or WeightDtypes.uniform(self.weight_dtype)

    def weight_bytes(self, weight_dtype: str | None = None) -> float:
        """Bytes of the stored weights, each part at its dtype (`weight_dtypes`)."""
        d = self.weight_dtypes(weight_dtype)
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return (
            (self.embedding_params + head) * dtype_bytes(d.embeddings)
            + self.num_layers * self._attention_params() * dtype_bytes(d.attention)
            + self._dense_mlp_params() * dtype_bytes(d.mlp)
            + self._expert_params(False) * dtype_bytes(d.experts)
        )

    # ---- FLOPs -------------------------------------------------------------------------------------------
    def linear_flops_per_token(self) -> float:
        return 2.0 * self.active_params

    def attention_flops_per_token(self, context: float) -> float:
        """QK^T and AV for one query token attending `context` tokens (itself included): every full layer
        attends all of them, every sliding layer at most its window."""
        window = min(context, self.sliding_window) if self.sliding_layers else 0.0
        return self._attention_flops_per_layer * (self.full_layers * context + self.sliding_layers * window)

    @property
    def _attention_flops_per_layer(self) -> float:
        """FLOPs of one layer's QK^T and AV for one (query, key) pair."""
        if self.mla is not None:
            qk = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
            v = self.mla.v_head_dim
        else:
            qk = v = self.head_dim
        return 2.0 * self.num_heads * (qk + v)

    def expert_weight_bytes_per_layer(self, weight_dtype: str | None = None) -> float:
        """Bytes of one routed expert in one layer (0 for dense models)."""
        if self.moe is None:
            return 0.0
        return (
            3 * self.hidden_size * self.moe.expert_intermediate * dtype_bytes(self.weight_dtypes(weight_dtype).experts)
        )


def geometry_from_config(config: Mapping[str, Any], name: str) -> ModelGeometry:
    """A ModelGeometry from a config.json dict (transformers' field names)."""

    def need(key: str) -> Any:
        if key not in config:
            raise ModelConfigError(f"{name}: config.json lacks {key!r}, which the simulator needs")
        return config[key]

    hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    layers = int(need("num_hidden_layers"))
    moe = mla = None
    experts = config.get("num_local_experts") or config.get("n_routed_experts") or config.get("num_experts")
    if experts:
        dense_first = int(config.get("first_k_dense_replace", 0))
        sparse_step = int(config.get("decoder_sparse_step", 1))
        dense_only = set(config.get("mlp_only_layers") or ())
        moe_layers = sum(1 for i in range(dense_first, layers) if i not in dense_only and (i + 1) % sparse_step == 0)
        moe = Moe(
            num_layers=moe_layers,
            num_experts=int(experts),
            top_k=int(need("num_experts_per_tok")),
            expert_intermediate=int(config.get("moe_intermediate_size") or need("intermediate_size")),
            shared_experts=int(config.get("n_shared_experts") or 0),
        )
    if config.get("kv_lora_rank"):
        mla = Mla(
            kv_lora_rank=int(config["kv_lora_rank"]),
            q_lora_rank=config.get("q_lora_rank"),
            qk_nope_head_dim=int(need("qk_nope_head_dim")),
            qk_rope_head_dim=int(need("qk_rope_head_dim")),
            v_head_dim=int(need("v_head_dim")),
        )
    window, sliding = _sliding_layers(config, name, layers)
    weight_dtype, weights = _weight_dtypes(config)
    return ModelGeometry(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        moe=moe,
        mla=mla,
        weight_dtype=weight_dtype,
        weights=weights,
        sliding_window=window,
        sliding_layers=sliding,
    )


def _sliding_layers(config: Mapping[str, Any], name: str, layers: int) -> tuple[int | None, int]:
    """(window, how many layers use it): `layer_types` when the config lists them (gpt-oss, Gemma 3), else
    every layer when `sliding_window` is set and not switched off (Mistral 7B v0.1; Qwen2's
    use_sliding_window is false)."""
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if types is not None:
        unknown = sorted(set(types) - {SLIDING, FULL})
        if unknown or len(types) != layers:
            raise ModelConfigError(
                f"{name}: layer_types must list {layers} of {SLIDING!r} / {FULL!r}, not {len(types)} with {unknown}"
            )
        sliding = types.count(SLIDING)
    else:
        sliding = layers if window and config.get("use_sliding_window", True) else 0
    if sliding and not (isinstance(window, int) and window >= 1):
        raise ModelConfigError(
            f"{name}: {sliding} sliding layers but sliding_window is {window!r}; set it to the window's tokens"
        )
    return (window if sliding else None), sliding


def _weight_dtypes(config: Mapping[str, Any]) -> tuple[str, WeightDtypes]:
    """The checkpoint's main weight dtype and each part's, from `quantization_config` (fp8: every linear
    layer; mxfp4: the experts, attention too unless the config keeps `self_attn` unconverted)."""
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8", WeightDtypes.uniform("fp8")
    if method == "mxfp4":
        kept = " ".join(quant.get("modules_to_not_convert") or ())
        attention = "bf16" if "self_attn" in kept else "mxfp4"
        return "bf16", WeightDtypes(attention=attention, mlp="bf16", experts="mxfp4")
    return "bf16", WeightDtypes()


def known_models() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in MODELS_DIR.glob("*.json")))


def load_geometry(name_or_path: str) -> ModelGeometry:
    """A shipped model by name (`qwen2.5-72b`, see `known_models()`), or a config.json / model folder path."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        path = MODELS_DIR / f"{name_or_path.lower()}.json"
    if not path.is_file():
        raise ModelConfigError(
            f"model {name_or_path!r}: not a shipped model ({', '.join(known_models())}) nor a config.json path"
        )
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelConfigError(f"{path}: not valid JSON ({error})") from None
    return geometry_from_config(config, path.stem if path.name != "config.json" else path.parent.name)
