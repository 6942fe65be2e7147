"""Workloads from real and vLLM-style datasets, read through Hugging Face `datasets`.

Names `load_workload` routes here (the part after the colon is a path, or a hub name where the hub is
reachable):

    sharegpt:FILE      ShareGPT JSON or JSONL as vLLM's benchmark reads it: records with `conversations`, a list
                       of {"from": "human"|"gpt", "value": text}. Each conversation is a session and each
                       human turn a request; its max_tokens is the token length of the dataset's answer, and
                       the next turn carries the engine's real answer (as every kvbench conversation does).
                       Read lazily, only the conversations the run needs, with bounds per file, record and
                       message (`sharegpt_file`).
    dataset:PATH|NAME  any dataset `datasets` opens from disk: a .parquet, .arrow, .json(l) or .csv file, a
                       folder written by `save_to_disk` (read with `load_from_disk`), or a hub name. Columns
                       are mapped by options: `prompt_column` (default prompt), `output_column` (an answer
                       whose token length is max_tokens) or `output_len` (default 128), `split` (default
                       train). One request per row.
    random             vLLM's `random` dataset: prompts of `input_len` (default 1024) random tokens and
                       outputs of `output_len` (128), each length drawn uniformly within +-`range_ratio`
                       (0.0) of it, after a shared prefix of `prefix_len` (0) tokens.
    prefix_repetition  vLLM's `prefix_repetition`: `num_prefixes` (10) random prefixes of `prefix_len` (256)
                       tokens, each prompt one of them plus a random suffix of `suffix_len` (256) tokens,
                       outputs of `output_len` (128); prompts of all prefixes shuffled together.

Text is tokenized with the local tokenizer folder given as the `tokenizer` option (`kvbench run --tokenizer`
passes its own); random ids stay within the model's vocabulary (`vocab_size`). Sessions all arrive at 0: the
load point (`--request-rate`, `--rate`, `--concurrency`) decides when they are sent. A missing file, column or
tokenizer is a WorkloadError naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from kvbench.workloads.sharegpt_file import conversations
from kvbench.workloads.spec import Session, Turn, Workload, WorkloadError, token_array
from kvbench.workloads.tokens import DEFAULT_VOCAB_SIZE, MAX_TOKENS_PER_FIELD, safe_token_range

SHAREGPT = "sharegpt:"
DATASET = "dataset:"
RANDOM = "random"
PREFIX_REPETITION = "prefix_repetition"
TEXT_PREFIXES = (SHAREGPT, DATASET)
_OPTIONS = {
    SHAREGPT: ("tokenizer", "output_len", "max_turns"),
    DATASET: ("tokenizer", "prompt_column", "output_column", "output_len", "split"),
    RANDOM: ("input_len", "output_len", "range_ratio", "prefix_len"),
    PREFIX_REPETITION: ("prefix_len", "suffix_len", "num_prefixes", "output_len"),
}
_DEFAULT_PROMPTS = 100  # sessions of `random`/`prefix_repetition` when num_sessions is not given
_EMPTY = token_array([])


def is_dataset_name(name: str) -> bool:
    return name.startswith(TEXT_PREFIXES) or name in (RANDOM, PREFIX_REPETITION)


def needs_tokenizer(name: str) -> bool:
    return name.startswith(TEXT_PREFIXES)


def load_dataset_workload(
    name: str,
    *,
    seed: int = 0,
    num_sessions: int | None = None,
    options: Mapping[str, object] | None = None,
    vocab_size: int | None = None,
) -> Workload:
    """The workload `name` names (see the module's docstring), the first `num_sessions` of it."""
    kind = next((prefix for prefix in TEXT_PREFIXES if name.startswith(prefix)), name)
    options = dict(options or {})
    unknown = sorted(set(options) - set(_OPTIONS[kind]))
    if unknown:
        raise WorkloadError(
            f"workload {name!r}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(_OPTIONS[kind])}"
        )
    vocab = vocab_size or DEFAULT_VOCAB_SIZE
    if kind == RANDOM:
        sessions = _random(seed, num_sessions or _DEFAULT_PROMPTS, vocab, options)
    elif kind == PREFIX_REPETITION:
        sessions = _prefix_repetition(seed, num_sessions or _DEFAULT_PROMPTS, vocab, options)
    else:
        encode = _encoder(name, options.get("tokenizer"))
        source = name[len(kind) :]
        if kind == SHAREGPT:
            sessions = _sharegpt(_sharegpt_records(source), encode, num_sessions, options)
        else:
            sessions = _columns(_open(source, kind, options.get("split", "train")), encode, num_sessions, options, name)
        if not sessions:
            raise WorkloadError(f"workload {name!r}: no usable record (a prompt and an answer) in {source}")
    params = {
        "dataset": name,
        **{key: value for key, value in options.items() if key != "tokenizer"},
        "tokenizer": options.get("tokenizer"),
    }
    return Workload(
        name=Path(name.split(":", 1)[-1]).stem or name, sessions=tuple(sessions), vocab_size=vocab, params=params
    )


# --- text datasets ---------------------------------------------------------------------------------------


def _encoder(name: str, tokenizer: object) -> Callable[[str], np.ndarray]:
    if not tokenizer:
        raise WorkloadError(
            f"workload {name!r} is text: give a local tokenizer folder (kvbench run --tokenizer DIR, "
            "or the workload option tokenizer: DIR)"
        )
    try:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"workload {name!r}: tokenizer {tokenizer}: {' '.join(str(exc).split())[:200]}") from None
    return lambda text: token_array(loaded.encode(text, add_special_tokens=False))


def _open(source: str, kind: str, split: object):
    """The rows of `source` through `datasets`: a saved folder, a data file by its suffix, or a hub name."""
    import datasets

    path = Path(source)
    builders = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}
    try:
        if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
            loaded = datasets.load_from_disk(str(path))
            return loaded[str(split)] if isinstance(loaded, datasets.DatasetDict) else loaded
        if path.suffix.lower() in builders:
            if not path.is_file():
                raise WorkloadError(f"workload file {source} does not exist")
            return datasets.load_dataset(builders[path.suffix.lower()], data_files=str(path), split="train")
        return datasets.load_dataset(source, split=str(split))
    except WorkloadError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; each is one line for the user
        raise WorkloadError(f"dataset {source}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None


def _length(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_TOKENS_PER_FIELD:
        raise WorkloadError(f"option {name}: expected an integer {minimum}..{MAX_TOKENS_PER_FIELD}, got {value!r}")
    return value


def _sharegpt_records(source: str):
    """The conversations of a ShareGPT file, read lazily (`sharegpt_file`)."""
    path = Path(source)
    if path.suffix.lower() not in (".json", ".jsonl"):
        raise WorkloadError(f"sharegpt:{source}: expected a .json or .jsonl file")
    if not path.is_file():
        raise WorkloadError(f"workload file {source} does not exist")
    return conversations(path)


def _sharegpt(records, encode, limit: int | None, options: Mapping) -> list[Session]:
    """Sessions of the first `limit` usable conversations; `records` is read no further than that."""
    fixed = _length(options["output_len"], "output_len") if "output_len" in options else None
    max_turns = _length(options["max_turns"], "max_turns") if "max_turns" in options else None
    sessions = []
    for index, (record_id, messages) in enumerate(records):
        pairs = _exchanges(messages)[:max_turns]
        turns = tuple(Turn(encode(ask), fixed or max(len(encode(answer)), 1)) for ask, answer in pairs if ask)
        if turns:
            sessions.append(Session(str(record_id or f"conv{index}"), "default", 0.0, _EMPTY, turns))
        if limit is not None and len(sessions) >= limit:
            break
    return sessions


def _exchanges(conversation: Sequence[tuple[str | None, str]]) -> list[tuple[str, str]]:
    """(human text, gpt text) pairs in order; a leading answer (no question) and a last question without an
    answer are dropped, as vLLM's ShareGPT reader takes only answered prompts."""
    pairs, question = [], None
    for role, text in conversation:
        if role in ("human", "user"):
            question = text
        elif role in ("gpt", "assistant", "chatgpt", "bard") and question is not None:
            pairs.append((question, text))
            question = None
    return pairs


def _columns(rows, encode, limit: int | None, options: Mapping, name: str) -> list[Session]:
    prompt = str(options.get("prompt_column", "prompt"))
    output = options.get("output_column")
    for column in [prompt] + ([str(output)] if output else []):
        if column not in rows.column_names:
            raise WorkloadError(
                f"{name}: no column {column!r}; columns: {', '.join(rows.column_names)} (map one with "
                "the option prompt_column / output_column)"
            )
    fixed = _length(options.get("output_len", 128), "output_len")
    sessions = []
    for index, row in enumerate(rows):
        if limit is not None and len(sessions) >= limit:
            break
        text = row[prompt]
        if not isinstance(text, str) or not text:
            continue
        max_tokens = max(len(encode(str(row[output]))), 1) if output else fixed
        sessions.append(Session(f"row{index}", "default", 0.0, _EMPTY, (Turn(encode(text), max_tokens),)))
    return sessions


# --- vLLM's synthetic datasets -----------------------------------------------------------------------------


def _ids(rng: np.random.Generator, length: int, vocab: int) -> np.ndarray:
    ids = safe_token_range(vocab)
    return token_array(rng.integers(ids.low, ids.high, size=length))


def _random(seed: int, count: int, vocab: int, options: Mapping) -> list[Session]:
    input_len = _length(options.get("input_len", 1024), "input_len")
    output_len = _length(options.get("output_len", 128), "output_len")
    prefix_len = _length(options.get("prefix_len", 0), "prefix_len", minimum=0)
    ratio = options.get("range_ratio", 0.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise WorkloadError(f"option range_ratio: expected a number in [0, 1), got {ratio!r}")
    rng = np.random.default_rng(seed)
    prefix = _ids(rng, prefix_len, vocab)
    inputs = rng.integers(max(int(input_len * (1 - ratio)), 1), int(input_len * (1 + ratio)) + 1, size=count)
    outputs = rng.integers(max(int(output_len * (1 - ratio)), 1), int(output_len * (1 + ratio)) + 1, size=count)
    return [
        Session(f"random{i}", "default", 0.0, prefix, (Turn(_ids(rng, int(inputs[i]), vocab), int(outputs[i])),))
        for i in range(count)
    ]


def _prefix_repetition(seed: int, count: int, vocab: int, options: Mapping) -> list[Session]:
    prefix_len = _length(options.get("prefix_len", 256), "prefix_len")
    suffix_len = _length(options.get("suffix_len", 256), "suffix_len")
    prefixes = _length(options.get("num_prefixes", 10), "num_prefixes")
    output_len = _length(options.get("output_len", 128), "output_len")
    rng = np.random.default_rng(seed)
    shared = [_ids(rng, prefix_len, vocab) for _ in range(prefixes)]
    sessions = [
        Session(
            f"prefix{i % prefixes}-{i}",
            "default",
            0.0,
            shared[i % prefixes],
            (Turn(_ids(rng, suffix_len, vocab), output_len),),
        )
        for i in range(count)
    ]
    order = rng.permutation(count)
    return [sessions[index] for index in order]
