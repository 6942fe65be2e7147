"""`load_model`: weights, tokenizer, chat template and stop tokens from one source."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.llama import LlamaForCausalLM
from kvbench.engines.kvengine.model.parallel import SINGLE, TensorParallel
from kvbench.engines.kvengine.model.weights import load_state_dict, resolve_source


@dataclass(frozen=True)
class LoadedModel:
    """A ready model: `model.forward(batch, kv_cache)`, its tokenizer (transformers) and stop tokens. `config` is
    the whole model's geometry; a tensor-parallel rank's `model.config` is its own part of it."""

    model: LlamaForCausalLM
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    config: ModelConfig
    eos_token_ids: frozenset[int]
    folder: Path  # the safetensors folder it was read from

    def chat_prompt_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` rendered with the model's chat template."""
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def load_model(
    source: str = "default",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    parallel: TensorParallel = SINGLE,
) -> LoadedModel:
    """Load a Llama-family model from 'default', a .gguf file or a safetensors folder (see `weights.py`); with
    several ranks, this rank's shard of it."""
    from transformers import AutoTokenizer

    folder = resolve_source(source)
    config = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, parallel=parallel)
    model.load_hf_state_dict(load_state_dict(folder, parallel=parallel, config=config))
    model = model.to(device=device, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.chat_template is None:
        raise ValueError(f"{folder} has no chat template (chat_template.jinja or tokenizer_config.json)")
    return LoadedModel(model, tokenizer, config, _eos_ids(folder, tokenizer), folder)


def _eos_ids(folder: Path, tokenizer: Any) -> frozenset[int]:
    """Stop tokens: generation_config.json's eos_token_id (int or list) plus the tokenizer's eos."""
    ids: set[int] = set()
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else eos or [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError(f"{folder} names no eos token (generation_config.json or tokenizer)")
    return frozenset(ids)
