"""Model geometry of a Llama-family checkpoint, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (`rope_type: llama3`); the only scaling kvbench implements."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass and the KV store need to know about a model's shape."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    max_position_embeddings: int = 8192
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Read a `config.json` dict; accepts transformers 4 (`rope_theta`, `rope_scaling`) and 5
        (`rope_parameters`) spellings."""
        model_type = d.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config.json model_type={model_type!r} is not supported; kvbench's engine runs {SUPPORTED_MODEL_TYPES}"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json hidden_act={d['hidden_act']!r}: only 'silu' (SwiGLU) is supported")
        rope = dict(d.get("rope_parameters") or {})
        rope.update({k: v for k, v in (d.get("rope_scaling") or {}).items() if v is not None})
        theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        elif rope_type != "default":
            raise ValueError(f"config.json rope type {rope_type!r} is not supported (use 'default' or 'llama3')")
        num_heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(d.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
            max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
            model_type=model_type,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` dict transformers reads (used to save tiny models and to build test oracles)."""
        rope: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope.update(
                rope_type="llama3",
                factor=s.factor,
                low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position_embeddings,
            )
        return {
            "model_type": self.model_type,
            "architectures": [
                {"qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}.get(self.model_type, "LlamaForCausalLM")
            ],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else rope,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
        }

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        """Read `folder/config.json`."""
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: a model folder needs a Hugging Face config.json")
        return cls.from_hf_dict(json.loads(path.read_text()))
