"""Model geometry for the simulator: KV bytes per token, FLOPs per token and weight bytes, from a config.json.

Read from Hugging Face style `config.json` files (the ones shipped in `kvbench/sim/models/`, or any path).
Covers dense GQA models (Llama, Qwen2, Mistral), sparse MoE (Mixtral, Qwen3-MoE, DeepSeek-V3) and
multi-head latent attention (DeepSeek-V3: one compressed latent of `kv_lora_rank` plus a shared rope key of
`qk_rope_head_dim` per token and layer, instead of K and V per KV head).

Counting rules (what "per token" means here):

    KV bytes/token    GQA: layers * 2 (K and V) * kv_heads * head_dim * dtype bytes
                      MLA: layers * (kv_lora_rank + qk_rope_head_dim) * dtype bytes
    params            embeddings + lm_head (unless tied) + attention projections + MLPs (all experts)
    active params     the same with only top-k routed experts (+ shared experts) per MoE layer
    linear FLOPs      2 * (active params - input embedding) per token (a lookup costs no FLOPs)
    attention FLOPs   4 * layers * heads * head_dim_qk_v * context per token (QK^T and AV)

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
    "float32": 4, "float16": 2, "bfloat16": 2, "auto": 2, "fp8": 1, "int8": 1, "int4": 0.5,
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
    weight_dtype: str = "bf16"  # the checkpoint's native weight dtype

    # ---- KV ----------------------------------------------------------------------------------------------
    @property
    def kv_elements_per_token(self) -> int:
        """Stored KV elements per token over all layers."""
        if self.mla is not None:
            return self.num_layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        return self.kv_elements_per_token * dtype_bytes(kv_dtype)

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

    def _mlp_params(self, active: bool) -> int:
        h = self.hidden_size
        dense_layers = self.num_layers - (self.moe.num_layers if self.moe else 0)
        total = dense_layers * 3 * h * self.intermediate_size
        if self.moe is not None:
            m = self.moe
            experts = (m.top_k if active else m.num_experts) + m.shared_experts
            total += m.num_layers * (experts * 3 * h * m.expert_intermediate + h * m.num_experts)
        return total

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

    def weight_bytes(self, weight_dtype: str | None = None) -> float:
        return self.num_params * dtype_bytes(weight_dtype or self.weight_dtype)

    # ---- FLOPs -------------------------------------------------------------------------------------------
    def linear_flops_per_token(self) -> float:
        return 2.0 * self.active_params

    def attention_flops_per_token(self, context: float) -> float:
        """QK^T and AV for one query token attending `context` tokens (itself included)."""
        if self.mla is not None:
            qk = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
            v = self.mla.v_head_dim
        else:
            qk = v = self.head_dim
        return 2.0 * self.num_layers * self.num_heads * (qk + v) * context

    def expert_weight_bytes_per_layer(self, weight_dtype: str | None = None) -> float:
        """Bytes of one routed expert in one layer (0 for dense models)."""
        if self.moe is None:
            return 0.0
        return 3 * self.hidden_size * self.moe.expert_intermediate * dtype_bytes(weight_dtype or self.weight_dtype)


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
        moe = Moe(num_layers=moe_layers, num_experts=int(experts), top_k=int(need("num_experts_per_tok")),
                  expert_intermediate=int(config.get("moe_intermediate_size") or need("intermediate_size")),
                  shared_experts=int(config.get("n_shared_experts") or 0))
    if config.get("kv_lora_rank"):
        mla = Mla(kv_lora_rank=int(config["kv_lora_rank"]), q_lora_rank=config.get("q_lora_rank"),
                  qk_nope_head_dim=int(need("qk_nope_head_dim")), qk_rope_head_dim=int(need("qk_rope_head_dim")),
                  v_head_dim=int(need("v_head_dim")))
    quant = (config.get("quantization_config") or {}).get("quant_method")
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
        weight_dtype="fp8" if quant == "fp8" else "bf16",
    )


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
        raise ModelConfigError(f"model {name_or_path!r}: not a shipped model ({', '.join(known_models())}) "
                               "nor a config.json path")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelConfigError(f"{path}: not valid JSON ({error})") from None
    return geometry_from_config(config, path.stem if path.name != "config.json" else path.parent.name)
