"""`run_eval`: every KV setting through lm-eval (via the engine's adapter and URL) and direct divergence.

    for each KV setting:  adapter.start -> wait_healthy -> lm-eval local-completions -> adapter.stop
    then, in-process (kvengine only: full vocabulary, exact):
        corpus windows -> KL, top-1 agreement, perplexity against the baseline
        rag-chat prompts -> greedy generations -> exact match, first divergent token
    -> eval.md, eval.csv, eval_summary.csv, eval.json in the run folder

Other engines (vllm, sglang, lmcache, trtllm) are run by engine_eval.py with their own KV names (engine_kv.py):
lm-eval through their URL, and divergence from prompt logprobs where they return them (approximate KL).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.engines.kvengine.model.fp8 import DEFAULT_MARGIN
from kvbench.evals.divergence import DivergenceStats, GreedyStats, compare_generations
from kvbench.evals.engine_kv import IN_PROCESS_ENGINES, adapter_values, settings_for
from kvbench.evals.kv_settings import DEFAULT_DTYPES, DEFAULT_SCALES, KVSetting, baseline_of
from kvbench.evals.lm_eval_run import LMEvalOptions, TaskScore, run_lm_eval
from kvbench.evals.results import SettingResult, write_tables
from kvbench.evals.tasks import TASKS, check_tasks
from kvbench.measure.run_folder import EVAL_CONFIG_JSON, engine_dir
from kvbench.settings import SettingsError, build


@dataclass(frozen=True)
class EvalConfig:
    """What `kvbench eval` runs (YAML keys = field names). Defaults are the CI size; see `FULL_RUN` below.

    `limit` caps documents per lm-eval task (None: all). Divergence reads `divergence_tokens` of the corpus in
    windows of `divergence_window`; greedy runs `greedy_prompts` rag-chat prompts (their last
    `greedy_prompt_tokens` tokens) for `greedy_tokens` tokens. `engine_settings` go to the adapter as they are.
    """

    engine: str = "kvengine"
    model: str = "default"
    kv_dtypes: tuple[str, ...] = DEFAULT_DTYPES
    kv_scales: tuple[str, ...] = DEFAULT_SCALES
    tasks: tuple[str, ...] = tuple(TASKS)
    limit: int | None = 3
    lm_eval: bool = True
    divergence: bool = True
    divergence_tokens: int = 512
    divergence_window: int = 512
    greedy_prompts: int = 2
    greedy_prompt_tokens: int = 128
    greedy_tokens: int = 16
    tokenizer: str | None = None
    engine_settings: Mapping[str, object] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    num_concurrent: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        object.__setattr__(self, "kv_scales", tuple(self.kv_scales))
        object.__setattr__(self, "tasks", check_tasks(tuple(self.tasks)))
        settings_for(self.engine, self.kv_dtypes, self.kv_scales)  # validates
        for name in ("divergence_tokens", "divergence_window", "greedy_prompts", "greedy_prompt_tokens", "greedy_tokens"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise SettingsError(f"limit: must be >= 1 (or omitted for every document), got {self.limit}")

    @property
    def settings(self) -> tuple[KVSetting, ...]:
        return settings_for(self.engine, self.kv_dtypes, self.kv_scales)


# The documented full run (results/evals/), sized to ~15 minutes on a 2-core CPU at ~85 tokens/s of SmolLM2
# prefill: lm-eval recomputes each multiple-choice context per choice (prompt logprobs bypass the prefix
# cache), so documents are the expensive part; the KL/top-1 gate needs far fewer tokens than task deltas do.
FULL_RUN = {"limit": 12, "divergence_tokens": 2048, "divergence_window": 1024, "greedy_prompts": 3,
            "greedy_prompt_tokens": 256, "greedy_tokens": 24}


def load_eval_config(values: Mapping[str, object], where: str) -> EvalConfig:
    return build(EvalConfig, values, where)


Progress = Callable[[str], None]


def run_eval(config: EvalConfig, run_dir: Path, progress: Progress = lambda message: None) -> dict[str, Path]:
    """Run every setting, write the tables into `run_dir` and return their paths."""
    settings = config.settings
    baseline = baseline_of(settings)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / EVAL_CONFIG_JSON).write_text(json.dumps(dataclasses.asdict(config), indent=2, default=str))
    started = time.monotonic()
    scores: dict[str, tuple[TaskScore, ...]] = {setting.label: () for setting in settings}
    divergence: dict[str, DivergenceStats] = {}
    greedy: dict[str, GreedyStats] = {}
    method = ""
    if config.engine not in IN_PROCESS_ENGINES:
        served = _served_by_engine(config, settings, run_dir, progress)
        scores.update(served.scores)
        divergence, method = served.divergence, served.method
    elif config.lm_eval:
        tokenizer = Path(config.tokenizer) if config.tokenizer else _engine_tokenizer(config, run_dir)
        for setting in settings:
            progress(f"lm-eval: {setting.label}")
            scores[setting.label] = tuple(_lm_eval_setting(config, setting, tokenizer, run_dir))
    if config.divergence and config.engine in IN_PROCESS_ENGINES:
        divergence, greedy = _in_process(config, settings, baseline, progress)
        method = "exact (full-vocabulary logits, in-process)"
    results = [SettingResult(s.label, scores[s.label], divergence.get(s.label), method, greedy.get(s.label))
               for s in settings]
    notes = {
        "engine": config.engine, "model": config.model, "tasks": ", ".join(config.tasks),
        "lm-eval limit": "all documents" if config.limit is None else f"{config.limit} documents per task",
        "divergence": f"{method or 'not run'}; {config.divergence_tokens} corpus tokens in windows of "
                      f"{config.divergence_window}; greedy: " + (f"{config.greedy_prompts} rag-chat-mini prompts x "
                      f"{config.greedy_tokens} tokens" if config.engine in IN_PROCESS_ENGINES else "in-process only"),
        "scales": f"static, from the engine's calibration text (margin {DEFAULT_MARGIN:g}), as the engine serves"
                  if config.engine in IN_PROCESS_ENGINES else f"{config.engine}'s own (kv_scale does not apply)",
        "wall time": f"{time.monotonic() - started:.0f} s",
    }
    return write_tables(results, baseline.label, run_dir, notes)


def _adapter(config: EvalConfig, setting: KVSetting, run_dir: Path):
    from kvbench.engines.registry import engine_factory

    values = {**config.engine_settings, "model": config.model, **adapter_values(setting)}
    folder = engine_dir(run_dir, setting.label)
    folder.mkdir(parents=True, exist_ok=True)
    return engine_factory(config.engine)(values, folder)


def _lm_eval_setting(config: EvalConfig, setting: KVSetting, tokenizer: Path, run_dir: Path) -> list[TaskScore]:
    adapter = _adapter(config, setting, run_dir)
    adapter.start()
    try:
        adapter.wait_healthy(config.startup_timeout_s)
        options = LMEvalOptions(tokenizer=tokenizer, model_name=adapter.endpoint.model, limit=config.limit,
                                num_concurrent=config.num_concurrent)
        return run_lm_eval(adapter.endpoint.base_url, config.tasks, options, engine_dir(run_dir, setting.label))
    finally:
        adapter.stop()


def _engine_tokenizer(config: EvalConfig, run_dir: Path) -> Path:
    """The tokenizer folder lm-eval needs: the model's converted folder, or the tiny byte tokenizer saved once."""
    from kvbench.engines.kvengine.runtime.engine import TINY_RANDOM

    if config.model == TINY_RANDOM:
        from kvbench.engines.kvengine.runtime.tiny import byte_tokenizer

        folder = run_dir / "tokenizer"
        byte_tokenizer().save_pretrained(folder)
        return folder
    if config.engine not in IN_PROCESS_ENGINES:
        from kvbench.engines.vllm import resolve_model

        folder = Path(resolve_model(config.model))  # the model's local folder holds its tokenizer
        if not (folder / "tokenizer_config.json").exists():
            raise SettingsError(f"tokenizer: {config.engine} needs a local tokenizer folder for lm-eval and divergence; "
                                "set tokenizer: PATH")
        return folder
    from kvbench.engines.kvengine.model.weights import resolve_source

    return resolve_source(config.model)


def _served_by_engine(config: EvalConfig, settings, run_dir: Path, progress: Progress):
    """Another engine: every setting served by it and measured over HTTP (engine_eval.py)."""
    from transformers import AutoTokenizer

    from kvbench.evals import inprocess
    from kvbench.evals.engine_eval import run_engine_settings
    from kvbench.evals.tasks import corpus_text

    tokenizer = Path(config.tokenizer) if config.tokenizer else _engine_tokenizer(config, run_dir)
    codec = AutoTokenizer.from_pretrained(str(tokenizer))
    windows = inprocess.windows(list(codec(corpus_text())["input_ids"]), config.divergence_window, config.divergence_tokens)
    return run_engine_settings(config, settings, lambda setting: _adapter(config, setting, run_dir), tokenizer,
                               windows, len(codec), run_dir, progress)


def _in_process(config: EvalConfig, settings, baseline: KVSetting, progress: Progress):
    from kvbench.engines.kvengine.model.loader import load_model
    from kvbench.engines.kvengine.runtime.engine import TINY_RANDOM
    from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
    from kvbench.evals import inprocess
    from kvbench.evals.tasks import corpus_text

    loaded = tiny_loaded_model() if config.model == TINY_RANDOM else load_model(config.model)
    ids = list(loaded.tokenizer(corpus_text())["input_ids"])
    token_windows = inprocess.windows(ids, config.divergence_window, config.divergence_tokens)
    divergence = inprocess.divergence_pass(
        loaded, baseline, settings, token_windows,
        on_window=lambda done, total: progress(f"divergence: window {done}/{total}"),
    )
    prompts = inprocess.rag_chat_prompts(loaded.config.vocab_size, config.greedy_prompts, config.greedy_prompt_tokens)
    reference = inprocess.greedy_generations(loaded, config.model, baseline, prompts, config.greedy_tokens)
    greedy = {}
    for setting in settings:
        progress(f"greedy: {setting.label}")
        outputs = inprocess.greedy_generations(loaded, config.model, setting, prompts, config.greedy_tokens)
        greedy[setting.label] = compare_generations(reference, outputs)
    return divergence, greedy
