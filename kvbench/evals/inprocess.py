"""Our engine's model run in this process, so that divergence uses the full next-token distribution.

Windows of a corpus go through `LlamaForCausalLM` over a `PagedKVCache` in the KV setting's format, with the
static scales the engine itself installs (`calibrate_kv_scales` on the engine's fixed calibration text, same
margin) unless a `Calibration` says otherwise (the calibration study). Each window is one forward: its tokens
write K/V into the pages and read them back, as the engine does, so every position attends to quantized K/V.
Greedy generations go through the real `Engine` (scheduler, chunked prefill, decode steps); passkey prompts
are teacher-forced windows scored at the answer (`passkey.retrieved`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.engines.kvengine.model import fp8
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.calibration import calibrate_kv_scales, calibration_token_ids
from kvbench.engines.kvengine.model.kv_cache import KVScales, PagedKVCache
from kvbench.engines.kvengine.model.loader import LoadedModel
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.evals.divergence import EMPTY, DivergenceStats, PositionScores, Reference, compare_positions
from kvbench.evals.kv_settings import KVSetting
from kvbench.evals.passkey import PasskeyPrompt, retrieved


@dataclass(frozen=True)
class Calibration:
    """Where static FP8 scales come from: "engine" (the engine's fixed text) or "window" (the scored window
    itself, an oracle no server can have), and the headroom margin over the calibrated amax."""

    source: str = "engine"
    margin: float = fp8.DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if self.source not in ("engine", "window"):
            raise ValueError(f"calibration source {self.source!r}: use 'engine' or 'window'")
        fp8.scale_from_amax(torch.ones(()), torch.float8_e4m3fn, self.margin)  # validates the margin


ENGINE_CALIBRATION = Calibration()


def setting_scales(
    loaded: LoadedModel, setting: KVSetting, calibration: Calibration = ENGINE_CALIBRATION, ids: Sequence[int] = ()
) -> KVScales:
    """The static scales `setting` is served with: from the engine's calibration text, or (source "window")
    from `ids`. Computed once per setting and pass: each is a forward over the calibration text."""
    calib_ids = calibration_token_ids(loaded.tokenizer) if calibration.source == "engine" else list(ids)
    return calibrate_kv_scales(loaded.model, calib_ids, setting.kv_format, margin=calibration.margin)


def window_logits(
    loaded: LoadedModel,
    setting: KVSetting,
    ids: Sequence[int],
    calibration: Calibration = ENGINE_CALIBRATION,
    scales: KVScales | None = None,
) -> torch.Tensor:
    """Logits `[len(ids), vocab]` (fp32) of one window run from an empty cache in `setting`'s KV format.

    A setting with a `new_cache(config, num_pages, page_size, device, compute_dtype)` method (a test
    instrument, such as planted rounding noise) supplies its own cache."""
    model = loaded.model
    if scales is None:
        scales = setting_scales(loaded, setting, calibration, ids)
    num_pages = -(-len(ids) // DEFAULT_PAGE_SIZE)
    device = model.lm_head.weight.device
    dtype = model.lm_head.weight.dtype
    if hasattr(setting, "new_cache"):
        cache = setting.new_cache(loaded.config, num_pages, DEFAULT_PAGE_SIZE, device, dtype)
    else:
        cache = PagedKVCache(
            loaded.config, num_pages, DEFAULT_PAGE_SIZE, setting.kv_format, device, scales=scales, compute_dtype=dtype
        )
    chunk = SequenceChunk(list(ids), 0, range(num_pages))
    batch = ForwardBatch.build([chunk], DEFAULT_PAGE_SIZE, all_logits=True, device=device)
    with torch.inference_mode():
        return model(batch, cache)


def windows(ids: Sequence[int], window: int, max_tokens: int | None) -> list[list[int]]:
    """Consecutive, non-overlapping windows of `window` tokens over the first `max_tokens` ids (last may be short,
    but at least 2 tokens so that it scores a position)."""
    ids = list(ids[:max_tokens] if max_tokens else ids)
    return [ids[start : start + window] for start in range(0, len(ids), window) if len(ids[start : start + window]) > 1]


def position_pass(
    loaded: LoadedModel,
    baseline: KVSetting,
    settings: Sequence[KVSetting],
    token_windows: Sequence[Sequence[int]],
    calibration: Calibration = ENGINE_CALIBRATION,
    on_window: Callable[[int, int], None] | None = None,
) -> dict[str, list[PositionScores]]:
    """Per-position measures of every setting against `baseline`, one `PositionScores` per window (keyed by
    setting label). The baseline's own row compares its logits with themselves (one forward less per window;
    that a recompute gives the same logits is tests/evals/test_pipeline.py's business). Only one window's
    baseline logits are held at a time."""
    fixed = calibration.source == "engine"
    scales = {s.label: setting_scales(loaded, s, calibration) for s in [baseline, *settings]} if fixed else {}
    out: dict[str, list[PositionScores]] = {setting.label: [] for setting in settings}
    for index, ids in enumerate(token_windows):
        base = window_logits(loaded, baseline, ids, calibration, scales.get(baseline.label))[:-1]
        reference = Reference.of(base, torch.tensor(ids[1:]))
        for setting in settings:
            same = setting.label == baseline.label
            new = base if same else window_logits(loaded, setting, ids, calibration, scales.get(setting.label))[:-1]
            out[setting.label].append(compare_positions(reference, new))
        del reference
        if on_window is not None:
            on_window(index + 1, len(token_windows))
    return out


def divergence_pass(
    loaded: LoadedModel,
    baseline: KVSetting,
    settings: Sequence[KVSetting],
    token_windows: Sequence[Sequence[int]],
    calibration: Calibration = ENGINE_CALIBRATION,
    on_window: Callable[[int, int], None] | None = None,
) -> dict[str, DivergenceStats]:
    """Exact divergence of every setting against `baseline`, summed over windows (see `position_pass`)."""
    scored = position_pass(loaded, baseline, settings, token_windows, calibration, on_window)
    return {label: sum((w.stats for w in scores), EMPTY) for label, scores in scored.items()}


# An eval's batches are the same on every machine: a fixed prefill budget beside decodes (the engine's default,
# auto, is timed at start), the 128 that the engine's default was before auto.
EVAL_PREFILL_BESIDE_DECODES = 128


def greedy_generations(
    loaded: LoadedModel, model_name: str, setting: KVSetting, prompts: Sequence[Sequence[int]], max_tokens: int
) -> list[list[int]]:
    """Greedy (temperature 0) outputs of `prompts` from a fresh `Engine` in `setting`, exactly `max_tokens` each."""
    longest = max(len(prompt) for prompt in prompts) + max_tokens
    engine = Engine(
        EngineConfig(
            model=model_name,
            kv_dtype=setting.kv_dtype,
            kv_scale=setting.kv_scale,
            kv_capacity=max(longest * len(prompts), 1024),
            prefix_caching=False,
            max_model_len=max(longest, 64),
            max_prefill_beside_decodes=EVAL_PREFILL_BESIDE_DECODES,
        ),
        loaded=loaded,
    )
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.add(GenerationRequest(str(i), tuple(int(t) for t in prompt), max_tokens, ignore_eos=True))
    while engine.has_work():
        for output in engine.step():
            if output.error:
                raise RuntimeError(f"generation {output.request_id} failed: {output.error}")
            if output.token_id is not None:
                outputs[output.request_id].append(output.token_id)
    return [outputs[str(i)] for i in range(len(prompts))]


def corpus_prompts(ids: Sequence[int], count: int, prompt_tokens: int) -> list[list[int]]:
    """`count` real-text prompts of `prompt_tokens` consecutive corpus tokens, taken from the corpus's end
    backwards (the divergence windows read it from the start), wrapping round when the corpus is short."""
    ids = list(ids)
    if len(ids) < prompt_tokens:
        raise ValueError(f"the corpus has {len(ids)} tokens, fewer than one prompt of {prompt_tokens}")
    starts = [len(ids) - (i + 1) * prompt_tokens for i in range(count)]
    span = len(ids) - prompt_tokens + 1
    return [ids[start % span : start % span + prompt_tokens] for start in starts]


def passkey_pass(
    loaded: LoadedModel,
    baseline: KVSetting,
    settings: Sequence[KVSetting],
    prompts: Sequence[PasskeyPrompt],
    keep: Callable[[Sequence[bool]], bool],
    on_prompt: Callable[[str], None] | None = None,
) -> dict[str, dict[int, list[bool]]]:
    """Retrieval of every prompt, per setting and length. The baseline runs first on every length; the other
    settings run only on the lengths whose baseline outcomes `keep` accepts (a length the baseline fails at
    says nothing about a KV format)."""
    lengths = list(dict.fromkeys(p.length for p in prompts))

    def run(setting: KVSetting, chosen: Sequence[int]) -> dict[int, list[bool]]:
        scales = setting_scales(loaded, setting)
        out: dict[int, list[bool]] = {}
        for prompt in prompts:
            if prompt.length in chosen:
                if on_prompt is not None:
                    on_prompt(f"passkey: {setting.label} length {prompt.length} depth {prompt.depth:g}")
                logits = window_logits(loaded, setting, prompt.ids, scales=scales)
                out.setdefault(prompt.length, []).append(retrieved(logits.argmax(-1).tolist(), prompt))
        return out

    results = {baseline.label: run(baseline, lengths)}
    kept = [length for length in lengths if keep(results[baseline.label][length])]
    for setting in settings:
        if setting.label != baseline.label:
            results[setting.label] = run(setting, kept)
    return results
