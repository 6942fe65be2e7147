"""Torch model layer of kvbench's engine: Llama-family model over a paged, optionally FP8, KV store.

    load_model(source) -> LoadedModel          weights.py, loader.py (GGUF converted once to safetensors)
    PagedKVCache(config, num_pages, ...)       kv_cache.py, fp8.py (formats and codecs)
    calibrate_kv_scales(model, ids, ...)       calibration.py (static per-layer scales)
    model(ForwardBatch.build(chunks), cache)   batch.py, llama.py, attention.py (reference, packed varlen)
    LlamaForCausalLM(config, parallel=...)     parallel.py (a rank's shard of a tensor-parallel model)
    attention_for(device, fmt, dtype)          gpu_attention.py, triton_kernels.py (FlashInfer / Triton / varlen)
    DecodeGraphs(model, cache, ...)            cuda_graphs.py (decode steps replayed as CUDA graphs)
    sample / token_logprobs                    sampling.py
    tiny_model(seed)                           tiny.py (random weights for tests)

Imports the core (page size, KV format names: `core.kv_format.KVFormat` is what the cache and calibration
take; fp8.py maps its names to torch dtypes) and torch; never the runtime, the server or the config.
"""

from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.calibration import calibrate_kv_scales, calibration_token_ids
from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.kv_cache import KVScales, PagedKVCache
from kvbench.engines.kvengine.model.llama import LlamaForCausalLM
from kvbench.engines.kvengine.model.loader import LoadedModel, load_model
from kvbench.engines.kvengine.model.sampling import SamplingParams, TokenLogprobs, sample, token_logprobs
from kvbench.engines.kvengine.model.tiny import tiny_model

__all__ = [
    "ForwardBatch",
    "KVScales",
    "LlamaForCausalLM",
    "LoadedModel",
    "ModelConfig",
    "PagedKVCache",
    "SamplingParams",
    "SequenceChunk",
    "TokenLogprobs",
    "calibrate_kv_scales",
    "calibration_token_ids",
    "load_model",
    "sample",
    "tiny_model",
    "token_logprobs",
]
