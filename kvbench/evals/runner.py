"""`run_eval`: every KV setting through lm-eval (via the engine's adapter and URL) and direct divergence.

    for each KV setting:  adapter.start -> wait_healthy -> lm-eval local-completions -> adapter.stop
    then, in-process (kvengine only: full vocabulary, exact):
        corpus windows -> per-position KL, top-1 agreement, perplexity, next-token accuracy against the
                          baseline -> blocks of positions as paired items, overall and per position bucket
        passkey prompts -> the baseline on every length first, the settings on the lengths it passes
        real-text prompts -> greedy generations -> exact match (with an exact interval), first divergence
    -> eval.md, eval.csv, eval_summary.csv, eval.json, eval_positions.png in the run folder

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

from kvbench.engines.kvengine.core.kv_format import KVDtype
from kvbench.engines.kvengine.model.fp8 import DEFAULT_MARGIN
from kvbench.evals.divergence import EMPTY, compare_generations
from kvbench.evals.engine_kv import IN_PROCESS_ENGINES, adapter_values, settings_for
from kvbench.evals.items import DEFAULT_BLOCK, buckets, direct_metrics, make_items
from kvbench.evals.kv_settings import DEFAULT_DTYPES, DEFAULT_SCALES, KVSetting, baseline_of
from kvbench.evals.lm_eval_run import LMEvalOptions, TaskScore, run_lm_eval
from kvbench.evals.passkey import DEPTHS
from kvbench.evals.report import write_tables
from kvbench.evals.results import PasskeyOutcome, SettingResult
from kvbench.evals.tasks import TASKS, check_tasks
from kvbench.measure.run_folder import EVAL_CONFIG_JSON, engine_dir
from kvbench.settings import SettingsError, build


@dataclass(frozen=True)
class EvalConfig:
    """What `kvbench eval` runs (YAML keys = field names). Defaults are the CI size; see `FULL_RUN` below.

    `limit` caps documents per lm-eval task (None: all). Divergence reads `divergence_tokens` of the corpus in
    windows of `divergence_window` (up to the model's window; position buckets reach that far), and pairs
    blocks of `item_tokens` positions; greedy runs `greedy_prompts` real-text prompts of `greedy_prompt_tokens`
    tokens for `greedy_tokens` tokens; passkey runs one prompt per (length, depth) over the corpus (empty
    `passkey_lengths`: off). `engine_settings` go to the adapter as they are.
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
    item_tokens: int = DEFAULT_BLOCK
    greedy_prompts: int = 4
    greedy_prompt_tokens: int = 128
    greedy_tokens: int = 16
    passkey_lengths: tuple[int, ...] = ()
    passkey_depths: tuple[float, ...] = DEPTHS
    layer_profile: bool = True
    perf_run: str | None = None  # a `kvbench run` folder of the same KV settings: the quality-vs-performance table
    tokenizer: str | None = None
    engine_settings: Mapping[str, object] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    num_concurrent: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        object.__setattr__(self, "kv_scales", tuple(self.kv_scales))
        object.__setattr__(self, "tasks", check_tasks(tuple(self.tasks)))
        object.__setattr__(self, "passkey_lengths", tuple(int(n) for n in self.passkey_lengths))
        object.__setattr__(self, "passkey_depths", tuple(float(d) for d in self.passkey_depths))
        settings_for(self.engine, self.kv_dtypes, self.kv_scales)  # validates
        if any(not 0.0 <= depth <= 1.0 for depth in self.passkey_depths) or not self.passkey_depths:
            raise SettingsError(f"passkey_depths: each must be in [0, 1], got {list(self.passkey_depths)}")
        if any(length < 128 for length in self.passkey_lengths):
            raise SettingsError(f"passkey_lengths: each must be >= 128 tokens, got {list(self.passkey_lengths)}")
        for name in (
            "divergence_tokens",
            "divergence_window",
            "greedy_prompts",
            "greedy_prompt_tokens",
            "greedy_tokens",
            "item_tokens",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise SettingsError(f"limit: must be >= 1 (or omitted for every document), got {self.limit}")

    @property
    def settings(self) -> tuple[KVSetting, ...]:
        return settings_for(self.engine, self.kv_dtypes, self.kv_scales)


# The documented full run (results/evals/; its measured time and what it resolves: results/evals/README.md):
# the direct pass over 4 windows of the model's whole 8K window of real text (256 paired items of 128 positions,
# position buckets to 8K), passkey at 1K-8K, 24 greedy prompts, and the lm-eval tasks on 40 documents each.
FULL_RUN = {
    "lm_eval": True,
    "limit": 40,
    "tasks": ["kvb_plays_mc", "kvb_britannica_cloze"],
    "kv_dtypes": [KVDtype.FP32.value, KVDtype.FP8_E4M3.value, KVDtype.FP8_E5M2.value],
    "divergence_tokens": 32768,
    "divergence_window": 8192,
    "greedy_prompts": 24,
    "greedy_prompt_tokens": 192,
    "greedy_tokens": 16,
    "passkey_lengths": [1024, 2048, 4096, 8192],
    "passkey_depths": [0.1, 0.5, 0.9],
}
# A passkey length is used for the KV settings when the baseline retrieves at least this share of its prompts.
PASSKEY_BASELINE_MIN = 0.8
LAYERS = "layers"  # the key of the per-layer profile's markdown section among the in-process results
LAYER_TOKENS = 1024  # tokens of real text the per-layer K/V profile encodes


def load_eval_config(values: Mapping[str, object], where: str) -> EvalConfig:
    return build(EvalConfig, values, where)


Progress = Callable[[str], None]


def run_eval(config: EvalConfig, run_dir: Path, progress: Progress = lambda message: None) -> dict[str, Path]:
    """Run every setting, write the tables into `run_dir` and return their paths."""
    settings = config.settings
    baseline = baseline_of(settings)
    if config.perf_run is not None:  # a bad folder fails before the long part, not after it
        from kvbench.measure.run_folder import read_entries

        read_entries(Path(config.perf_run))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / EVAL_CONFIG_JSON).write_text(json.dumps(dataclasses.asdict(config), indent=2, default=str))
    started = time.monotonic()
    scores: dict[str, tuple[TaskScore, ...]] = {setting.label: () for setting in settings}
    measured: dict[str, dict] = {}  # SettingResult fields per label
    method = ""
    if config.engine not in IN_PROCESS_ENGINES:
        served = _served_by_engine(config, settings, run_dir, progress)
        scores.update(served.scores)
        measured = {label: {"divergence": stats} for label, stats in served.divergence.items()}
        for label, reason in served.refused.items():
            measured[label] = {"refused": reason}
        method = served.method
    elif config.lm_eval:
        tokenizer = Path(config.tokenizer) if config.tokenizer else _engine_tokenizer(config, run_dir)
        for setting in settings:
            progress(f"lm-eval: {setting.label}")
            scores[setting.label] = tuple(_lm_eval_setting(config, setting, tokenizer, run_dir))
    if config.divergence and config.engine in IN_PROCESS_ENGINES:
        measured = _in_process(config, settings, baseline, progress, run_dir)
        method = "exact (full-vocabulary logits, in-process)"
    sections = [measured.pop(LAYERS)] if LAYERS in measured else []
    results = [
        SettingResult(s.label, scores[s.label], divergence_method=method, **measured.get(s.label, {})) for s in settings
    ]
    if config.perf_run is not None:
        from kvbench.evals.report import write_tradeoff
        from kvbench.evals.results import metric_rows
        from kvbench.evals.tradeoff import perf_by_setting, tradeoff_frame

        perf = perf_by_setting(Path(config.perf_run), config.engine)
        frame = tradeoff_frame(perf, metric_rows(results, baseline.label), [s.label for s in settings])
        sections.insert(0, write_tradeoff(frame, run_dir, Path(config.perf_run)))
    notes = {
        "engine": config.engine,
        "model": config.model,
        "tasks": ", ".join(config.tasks),
        "lm-eval limit": "all documents" if config.limit is None else f"{config.limit} documents per task",
        "divergence": f"{method or 'not run'}; {config.divergence_tokens} corpus tokens in windows of "
        f"{config.divergence_window}, paired in blocks of {config.item_tokens} positions; greedy: "
        + (
            f"{config.greedy_prompts} real-text prompts of {config.greedy_prompt_tokens} tokens x "
            f"{config.greedy_tokens} tokens"
            if config.engine in IN_PROCESS_ENGINES
            else "in-process only"
        ),
        "passkey": (
            f"lengths {', '.join(map(str, config.passkey_lengths))} x depths "
            f"{', '.join(f'{d:g}' for d in config.passkey_depths)}; a length is used for the KV settings "
            f"when the baseline retrieves >= {PASSKEY_BASELINE_MIN:.0%}"
        )
        if config.passkey_lengths and config.engine in IN_PROCESS_ENGINES
        else "not run",
        "intervals": "95% percentile bootstrap over paired items (2000 resamples); McNemar exact on flips",
        "scales": f"static, from the engine's calibration text (margin {DEFAULT_MARGIN:g}), as the engine serves"
        if config.engine in IN_PROCESS_ENGINES
        else f"{config.engine}'s own (kv_scale does not apply)",
        "wall time": f"{time.monotonic() - started:.0f} s",
    }
    return write_tables(results, baseline.label, run_dir, notes, sections)


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
        options = LMEvalOptions(
            tokenizer=tokenizer,
            model_name=adapter.endpoint.model,
            limit=config.limit,
            num_concurrent=config.num_concurrent,
        )
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
            raise SettingsError(
                f"tokenizer: {config.engine} needs a local tokenizer folder for lm-eval and divergence; "
                "set tokenizer: PATH"
            )
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
    windows = inprocess.windows(
        list(codec(corpus_text())["input_ids"]), config.divergence_window, config.divergence_tokens
    )
    return run_engine_settings(
        config,
        settings,
        lambda setting: _adapter(config, setting, run_dir),
        tokenizer,
        windows,
        len(codec),
        run_dir,
        progress,
    )


def _in_process(
    config: EvalConfig, settings, baseline: KVSetting, progress: Progress, run_dir: Path
) -> dict[str, dict]:
    """Direct measures, position buckets, passkey and greedy divergence: SettingResult fields per label."""
    from kvbench.engines.kvengine.model.loader import load_model
    from kvbench.engines.kvengine.runtime.engine import TINY_RANDOM
    from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
    from kvbench.evals import inprocess
    from kvbench.evals.passkey import passkey_prompts
    from kvbench.evals.tasks import corpus_text

    loaded = tiny_loaded_model() if config.model == TINY_RANDOM else load_model(config.model)
    window_max = loaded.config.max_position_embeddings
    for name, longest in (
        ("divergence_window", config.divergence_window),
        ("passkey_lengths", max(config.passkey_lengths, default=0)),
    ):
        if longest > window_max:
            raise SettingsError(f"{name}: {longest} tokens exceed the model's {window_max}-position window")
    text = corpus_text()
    ids = list(loaded.tokenizer(text)["input_ids"])
    token_windows = inprocess.windows(ids, config.divergence_window, config.divergence_tokens)
    scored = inprocess.position_pass(
        loaded,
        baseline,
        settings,
        token_windows,
        on_window=lambda done, total: progress(f"divergence: window {done}/{total}"),
    )
    out: dict[str, dict] = {}
    spans = buckets(max(len(w) for w in token_windows))
    for setting in settings:
        windows_of = scored[setting.label]
        out[setting.label] = {
            "divergence": sum((w.stats for w in windows_of), EMPTY),
            "direct": tuple(direct_metrics(make_items(windows_of, config.item_tokens))),
            "positions": tuple(
                (low, high, tuple(direct_metrics(make_items(windows_of, config.item_tokens, low, high))))
                for low, high in spans
            ),
        }
    if config.layer_profile:
        from kvbench.evals.layers import layer_errors
        from kvbench.evals.report import write_layer_profile

        progress("per-layer K/V error profile")
        out[LAYERS] = write_layer_profile(layer_errors(loaded, settings, token_windows[0][:LAYER_TOKENS]), run_dir)
    if config.passkey_lengths:
        encode = lambda t: list(loaded.tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
        prompts = passkey_prompts(encode, ids, config.passkey_lengths, config.passkey_depths)
        outcomes = inprocess.passkey_pass(
            loaded,
            baseline,
            settings,
            prompts,
            keep=lambda hits: sum(hits) >= PASSKEY_BASELINE_MIN * len(hits),
            on_prompt=progress,
        )
        for setting in settings:
            out[setting.label]["passkey"] = tuple(
                PasskeyOutcome(length, config.passkey_depths, tuple(hits))
                for length, hits in outcomes.get(setting.label, {}).items()
            )
    prompts = inprocess.corpus_prompts(ids, config.greedy_prompts, config.greedy_prompt_tokens)
    reference = inprocess.greedy_generations(loaded, config.model, baseline, prompts, config.greedy_tokens)
    for setting in settings:
        progress(f"greedy: {setting.label}")
        outputs = inprocess.greedy_generations(loaded, config.model, setting, prompts, config.greedy_tokens)
        out[setting.label]["greedy"] = compare_generations(reference, outputs)
    return out
