"""Named workload profiles and `load_workload`, the one entry point from a name or a file to a `Workload`.

    rag-chat          the article's sizes: 1.5K-token system prompt, 8 x 1K documents, ~200-token user turns,
                      ~6 turns, think times of seconds to many minutes, one tenant
    rag-chat-mini     small enough for CPU engines: prompts of a few hundred to ~1.5K tokens, outputs of tens
                      of tokens, think times of 0.2-2 s; 10 sessions (~40 requests) take seconds
    rag-chat-mt       rag-chat with four tenants: their own system prompts and corpora, skewed shares
                      (50/25/15/10 %), one premium tenant and three basic ones
    rag-chat-mt-mini  rag-chat-mini with the same tenant mix
    shared-prefix     inference-perf's shared_prefix data as llm-d's precise-prefix guide runs it: 150 groups x 5
                      prompts, 6,000-token system prompts, 1,200-token questions, 1,000 output tokens
                      (`workloads/shared_prefix.py`); one request per session, arrivals from the load

`sharegpt:FILE`, `dataset:PATH`, `random` and `prefix_repetition` are real or vLLM-style datasets read through
Hugging Face `datasets` (`text_datasets.py`); their options come as `overrides`.

A path is read by its kind: `.jsonl` is Mooncake or kvbench JSONL (sniffed from the first record), `.csv` is
an Azure trace, `.yaml`/`.yml` holds rag-chat parameters: any `RagChatParams` field, plus an optional
`profile:` to start from (default `rag-chat`) and an optional `name:`; with `generator: shared_prefix` it holds
`SharedPrefixParams` fields instead (inference-perf's names: num_groups, num_prompts_per_group,
system_prompt_len, question_len, output_len; plus num_requests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from kvbench.settings import read_yaml
from kvbench.workloads.ragchat import RagChatParams, generate_rag_chat
from kvbench.workloads.shared_prefix import SharedPrefixParams, generate_shared_prefix
from kvbench.workloads.spec import Session, TenantSpec, Turn, Workload, WorkloadError
from kvbench.workloads.text_datasets import is_dataset_name, load_dataset_workload
from kvbench.workloads.traces import TRACE_READERS, sniff_trace_format

_MULTI_TENANT = (
    TenantSpec("tenant-a", share=0.50, tier="premium"),
    TenantSpec("tenant-b", share=0.25, tier="basic"),
    TenantSpec("tenant-c", share=0.15, tier="basic"),
    TenantSpec("tenant-d", share=0.10, tier="basic"),
)

_MINI = RagChatParams(
    num_sessions=10,
    session_rate=2.0,
    system_tokens=192,
    corpus_docs=16,
    docs_per_session=2,
    doc_tokens=256,
    turns_mean=4.0,
    turns_max=6,
    user_tokens_mean=48.0,
    user_tokens_cv=0.4,
    user_tokens_min=16,
    user_tokens_max=96,
    output_tokens_mean=24.0,
    output_tokens_cv=0.4,
    output_tokens_min=8,
    output_tokens_max=48,
    think_time_median_s=0.6,
    think_time_sigma=0.6,
    think_time_min_s=0.2,
    think_time_max_s=2.0,
)

PROFILES: Mapping[str, RagChatParams] = MappingProxyType(
    {
        "rag-chat": RagChatParams(),
        "rag-chat-mini": _MINI,
        "rag-chat-mt": RagChatParams(tenants=_MULTI_TENANT),
        "rag-chat-mt-mini": dataclasses.replace(_MINI, tenants=_MULTI_TENANT, num_sessions=20),
    }
)

SHARED_PREFIX = "shared-prefix"
GENERATOR_SHARED_PREFIX = "shared_prefix"  # the `generator:` key of a parameter file (inference-perf's type name)
_PARAM_SUFFIXES = (".yaml", ".yml")
_TRACE_SUFFIXES = (".jsonl", ".csv")


def load_workload(
    name_or_path: str,
    *,
    seed: int = 0,
    num_sessions: int | None = None,
    overrides: Mapping[str, object] | None = None,
    vocab_size: int | None = None,
    time_scale: float = 1.0,
) -> Workload:
    """A workload from a profile name, a trace file or a YAML file of rag-chat parameters.

    `num_sessions` sets the session count of a generator (shared-prefix: its request count) or keeps the first
    rows/sessions of a trace;
    `overrides` replaces rag-chat parameters (traces take none); `vocab_size` bounds token ids (default 32000,
    fits any model with >= 32K ids; pass the model's size for smaller vocabularies); `time_scale` multiplies
    arrival gaps and think times. Raises WorkloadError naming the valid choices or keys.
    """
    overrides = dict(overrides or {})
    suffix = Path(name_or_path).suffix.lower()
    if is_dataset_name(name_or_path):
        workload = load_dataset_workload(
            name_or_path, seed=seed, num_sessions=num_sessions, options=overrides, vocab_size=vocab_size
        )
        return _scaled(workload, time_scale)
    if name_or_path == SHARED_PREFIX:
        return _shared_prefix(SharedPrefixParams(), overrides, name_or_path, seed, num_sessions, vocab_size)
    if suffix in _PARAM_SUFFIXES:
        _require_file(name_or_path)
        document = read_yaml(Path(name_or_path), "workload parameters")
        if isinstance(document, dict) and document.get("generator") == GENERATOR_SHARED_PREFIX:
            return workload_from_mapping(
                document,
                Path(name_or_path).stem,
                seed=seed,
                num_sessions=num_sessions,
                vocab_size=vocab_size,
                where=name_or_path,
            )
    if name_or_path in PROFILES:
        params, name = PROFILES[name_or_path], name_or_path
    elif suffix in _PARAM_SUFFIXES:
        params, name = _params_from_yaml(Path(name_or_path))
    elif suffix in _TRACE_SUFFIXES:
        if overrides:
            raise WorkloadError(
                f"traces take no overrides (got {sorted(overrides)}); valid keys: none -- use "
                "num_sessions, time_scale, vocab_size and seed"
            )
        _require_file(name_or_path)
        reader = TRACE_READERS[sniff_trace_format(name_or_path)]
        options = {} if vocab_size is None else {"vocab_size": vocab_size}
        return reader(name_or_path, seed=seed, time_scale=time_scale, limit=num_sessions, **options)
    else:
        raise WorkloadError(
            f"unknown workload {name_or_path!r}: use a profile ({', '.join(PROFILES)}), a trace "
            f"({', '.join(_TRACE_SUFFIXES)}), a parameter file ({', '.join(_PARAM_SUFFIXES)}) or a dataset "
            "(sharegpt:FILE, dataset:PATH, random, prefix_repetition)"
        )
    if num_sessions is not None:
        overrides["num_sessions"] = num_sessions
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    workload = generate_rag_chat(params.replace(overrides), seed=seed, name=name)
    return _scaled(workload, time_scale)


def workload_from_mapping(
    document: Mapping[str, object],
    name: str,
    *,
    seed: int = 0,
    num_sessions: int | None = None,
    vocab_size: int | None = None,
    where: str = "workload",
) -> Workload:
    """A generator's workload from a parameter mapping (a parameter file's document, or a case file's
    `workload:`): `generator: shared_prefix` and SharedPrefixParams fields. WorkloadError naming the key."""
    document = dict(document)
    if document.pop("generator", None) != GENERATOR_SHARED_PREFIX:
        raise WorkloadError(
            f"{where}: field 'generator' must be {GENERATOR_SHARED_PREFIX!r} (rag-chat parameters "
            "are read from a parameter file)"
        )
    name = str(document.pop("name", name))
    try:
        params = SharedPrefixParams().replace(document)
    except (WorkloadError, TypeError) as error:
        raise WorkloadError(f"{where}: {error}") from None
    return _shared_prefix(params, {}, name, seed, num_sessions, vocab_size)


def _shared_prefix(
    params: SharedPrefixParams,
    overrides: Mapping[str, object],
    name: str,
    seed: int,
    num_requests: int | None,
    vocab_size: int | None,
) -> Workload:
    changes = dict(overrides)
    if num_requests is not None:
        changes["num_requests"] = num_requests
    if vocab_size is not None:
        changes["vocab_size"] = vocab_size
    return generate_shared_prefix(params.replace(changes), seed=seed, name=name)


def _params_from_yaml(path: Path) -> tuple[RagChatParams, str]:
    _require_file(path)
    document = read_yaml(path, "workload parameters")
    if not isinstance(document, dict):
        raise WorkloadError(f"{path}: expected a mapping of rag-chat parameters, got {type(document).__name__}")
    base = document.pop("profile", "rag-chat")
    name = str(document.pop("name", path.stem))
    if base not in PROFILES:
        raise WorkloadError(f"{path}: field 'profile' {base!r} is not one of {list(PROFILES)}")
    try:
        return PROFILES[base].replace(document), name
    except WorkloadError as error:
        raise WorkloadError(f"{path}: {error}") from None


def _scaled(workload: Workload, factor: float) -> Workload:
    """`workload` with arrival offsets and think times multiplied by `factor`."""
    if not factor > 0:
        raise WorkloadError(f"time_scale must be > 0 (it multiplies inter-arrival times), got {factor}")
    if factor == 1.0:
        return dataclasses.replace(workload, params={**workload.params, "time_scale": factor})
    sessions = tuple(
        Session(
            s.session_id,
            s.tenant,
            s.arrival_s * factor,
            s.context,
            tuple(Turn(t.user_tokens, t.max_tokens, t.think_time_s * factor) for t in s.turns),
        )
        for s in workload.sessions
    )
    return dataclasses.replace(workload, sessions=sessions, params={**workload.params, "time_scale": factor})


def _require_file(path: str | Path) -> None:
    if not Path(path).is_file():
        raise WorkloadError(f"workload file {path} does not exist")
