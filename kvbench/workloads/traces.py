"""Trace readers: Mooncake JSONL, Azure LLM CSV and kvbench's own JSONL, each into a `spec.Workload`.

Common options: `time_scale` multiplies every time (arrival offsets, hence inter-arrival gaps, and think
times; 0.5 replays twice as fast), `limit` keeps the first rows (Mooncake, Azure) or the first sessions by
arrival (kvbench JSONL), `vocab_size` bounds the synthetic token ids (see `tokens.safe_token_range`). Arrival
times are rebased so that the first request arrives at 0. A missing or invalid field raises `TraceFormatError`
with the message `file:line: field 'x' ...`.

Mooncake JSONL (kvcache-ai/Mooncake FAST25 traces), one request per line:
    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}
`timestamp` in ms; `hash_ids` has one id per 512-token block, chained (equal leading ids = equal prefix),
ceil(input_length / 512) of them. Each id maps to a fixed pseudo-random block of 512 token ids, so equal ids
give equal tokens; the last block is cut to input_length - 512 * (n - 1) tokens, a prefix of its block.

Azure LLM inference CSV (Azure/AzurePublicDataset 2023): header `TIMESTAMP,ContextTokens,GeneratedTokens`,
absolute wall-clock times such as `2023-11-16 18:15:46.6805900`. Lengths only: each row gets a unique random
prompt, so nothing is shared between requests.

kvbench JSONL, one turn per line; the lines of a session share `session_id` (any line order):
    session_id    str, required
    turn          int >= 0, required; a session's turns are 0..n-1 with no gaps
    arrival_s     float >= 0, required on turn 0 (the session's start, seconds from the start of the run);
                  not allowed on later turns, whose send time follows the previous answer plus think_time_s
    think_time_s  float >= 0, turns > 0 only (default 0)
    max_tokens    int >= 1, required: the output length to ask for
    tenant        str, turn 0 only (default "default"); tier: "premium" | "basic", turn 0 only (default basic)
    context_tokens | context_length   turn 0 only, optional: the session's fixed context (ids, or a length
                                      for random ids)
    user_tokens | user_length         the tokens this turn appends (ids or a length; default none); turn 0
                                      needs a context or user tokens
The prompt of turn k is context + user(0) + answer(0) + ... + user(k), answers being the engine's real output
(see `spec`). `write_kvbench_jsonl` writes any workload in this format (with ids), so a generated workload can
be saved, edited and replayed.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType

import numpy as np

from kvbench.workloads.spec import TOKEN_DTYPE, Session, TenantSpec, Turn, Workload, WorkloadError, token_array
from kvbench.workloads.tokens import (
    DEFAULT_VOCAB_SIZE,
    MAX_TOKENS_PER_FIELD,
    keyed_tokens,
    safe_token_range,
    stable_key,
)

MOONCAKE_BLOCK_TOKENS = 512
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_EMPTY = token_array(np.zeros(0, dtype=TOKEN_DTYPE))


class TraceFormatError(WorkloadError):
    """A trace row that cannot be read; the message starts with `file:line:`."""


def read_mooncake(
    path: str | Path,
    *,
    seed: int = 0,
    time_scale: float = 1.0,
    limit: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Workload:
    """A Mooncake JSONL trace: one single-turn session per request, block hashes mapped to token blocks."""
    _check_options(time_scale, limit)
    token_range = safe_token_range(vocab_size)
    domain = stable_key("mooncake-block", seed)
    rows = []
    for where, row in _json_lines(path, limit):
        timestamp = _number(row, "timestamp", where, minimum=0)
        length = _integer(row, "input_length", where, minimum=1)
        output = _integer(row, "output_length", where, minimum=1)
        hash_ids = row.get("hash_ids")
        blocks = math.ceil(length / MOONCAKE_BLOCK_TOKENS)
        if not isinstance(hash_ids, list) or not all(_is_int(h) and h >= 0 for h in hash_ids):
            raise TraceFormatError(f"{where}: field 'hash_ids' must be a list of ints >= 0, got {hash_ids!r:.80}")
        if len(hash_ids) != blocks:
            raise TraceFormatError(
                f"{where}: field 'hash_ids' has {len(hash_ids)} ids, expected "
                f"ceil(input_length / {MOONCAKE_BLOCK_TOKENS}) = {blocks}"
            )
        # A block's ids depend only on (seed, hash id), so equal hashes give equal tokens.
        keys = np.array([h & 0xFFFFFFFFFFFFFFFF for h in hash_ids], dtype=np.uint64) ^ np.uint64(domain)
        tokens = keyed_tokens(keys, MOONCAKE_BLOCK_TOKENS, token_range).reshape(-1)[:length]
        rows.append((timestamp / 1000.0, length, output, token_array(tokens)))
    sessions = _single_turn_sessions(rows, time_scale)
    return Workload(
        Path(path).name,
        sessions,
        vocab_size,
        (TenantSpec("default"),),
        {"trace": str(path), "format": "mooncake", "seed": seed, "time_scale": time_scale, "limit": limit},
    )


def read_azure(
    path: str | Path,
    *,
    seed: int = 0,
    time_scale: float = 1.0,
    limit: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Workload:
    """An Azure LLM inference CSV trace: one single-turn session per row with a unique random prompt."""
    _check_options(time_scale, limit)
    token_range = safe_token_range(vocab_size)
    rows = []
    first_ns = None
    with open(path, newline="", encoding="utf-8") as file, _text_errors(path):
        reader = csv.reader(file)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != AZURE_HEADER:
            raise TraceFormatError(f"{path}:1: header must be {','.join(AZURE_HEADER)}, got {header!r}")
        for values in reader:
            if limit is not None and len(rows) >= limit:
                break
            where = f"{path}:{reader.line_num}"
            if not values:
                continue
            if len(values) != len(AZURE_HEADER):
                raise TraceFormatError(f"{where}: expected {len(AZURE_HEADER)} fields, got {len(values)}")
            record = dict(zip(AZURE_HEADER, values))
            # Rebased in integer nanoseconds: a float of epoch seconds keeps only ~0.2 us.
            timestamp_ns = _wall_clock_ns(record["TIMESTAMP"], where)
            first_ns = timestamp_ns if first_ns is None else first_ns
            length = _integer(record, "ContextTokens", where, minimum=1, parse=True)
            output = _integer(record, "GeneratedTokens", where, minimum=1, parse=True)
            tokens = keyed_tokens(stable_key("azure-row", seed, len(rows)), length, token_range)
            rows.append(((timestamp_ns - first_ns) / 1e9, length, output, token_array(tokens)))
    sessions = _single_turn_sessions(rows, time_scale)
    return Workload(
        Path(path).name,
        sessions,
        vocab_size,
        (TenantSpec("default"),),
        {"trace": str(path), "format": "azure", "seed": seed, "time_scale": time_scale, "limit": limit},
    )


@dataclass(slots=True)
class _SessionLines:
    """The turns of one kvbench JSONL session while the file is read."""

    first_where: str
    turns: dict[int, tuple[str, dict]] = field(default_factory=dict)


def read_kvbench_jsonl(
    path: str | Path,
    *,
    seed: int = 0,
    time_scale: float = 1.0,
    limit: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Workload:
    """A kvbench JSONL workload (format in the module docstring); lengths become seeded random ids."""
    _check_options(time_scale, limit)
    token_range = safe_token_range(vocab_size)
    grouped: dict[str, _SessionLines] = {}
    for where, row in _json_lines(path, None):
        session_id = row.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            raise TraceFormatError(f"{where}: field 'session_id' must be a non-empty string, got {session_id!r}")
        turn = _integer(row, "turn", where, minimum=0)
        lines = grouped.setdefault(session_id, _SessionLines(where))
        if turn in lines.turns:
            raise TraceFormatError(
                f"{where}: field 'turn' {turn} repeats session {session_id!r}'s turn (first at {lines.turns[turn][0]})"
            )
        lines.turns[turn] = (where, row)
    sessions, tiers = [], {}
    for session_id, lines in grouped.items():
        session, tier = _kvbench_session(session_id, lines, seed, token_range, time_scale)
        if tiers.setdefault(session.tenant, tier) != tier:
            raise TraceFormatError(
                f"{lines.turns[0][0]}: field 'tier' {tier!r} differs from an earlier "
                f"session of tenant {session.tenant!r} ({tiers[session.tenant]!r})"
            )
        sessions.append(session)
    sessions.sort(key=lambda s: s.arrival_s)
    if limit is not None:
        sessions = sessions[:limit]
    if sessions:
        start = sessions[0].arrival_s
        sessions = [_with_arrival(s, s.arrival_s - start) for s in sessions]
    counts = {t: sum(s.tenant == t for s in sessions) for t in dict.fromkeys(s.tenant for s in sessions)}
    tenants = tuple(TenantSpec(t, n / len(sessions), tiers[t]) for t, n in counts.items()) or (TenantSpec("default"),)
    return Workload(
        Path(path).name,
        tuple(sessions),
        vocab_size,
        tenants,
        {"trace": str(path), "format": "kvbench", "seed": seed, "time_scale": time_scale, "limit": limit},
    )


def write_kvbench_jsonl(workload: Workload, path: str | Path) -> None:
    """Writes `workload` as kvbench JSONL with explicit token ids (read back by `read_kvbench_jsonl`)."""
    tiers = {t.name: t.tier for t in workload.tenants}
    with open(path, "w") as file:
        for session in workload.sessions:
            for index, turn in enumerate(session.turns):
                row: dict[str, object] = {"session_id": session.session_id, "turn": index}
                if index == 0:
                    row |= {
                        "arrival_s": session.arrival_s,
                        "tenant": session.tenant,
                        "tier": tiers.get(session.tenant, "basic"),
                        "context_tokens": session.context.tolist(),
                    }
                else:
                    row["think_time_s"] = turn.think_time_s
                row |= {"max_tokens": turn.max_tokens, "user_tokens": turn.user_tokens.tolist()}
                file.write(json.dumps(row) + "\n")


def sniff_trace_format(path: str | Path) -> str:
    """`mooncake`, `kvbench` or `azure` from the extension and the first record; TraceFormatError otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix != ".jsonl":
        raise TraceFormatError(f"{path}: not a trace (expected .jsonl for Mooncake or kvbench JSONL, .csv for Azure)")
    for _, row in _json_lines(path, 1):
        if "hash_ids" in row:
            return "mooncake"
        if "session_id" in row:
            return "kvbench"
        raise TraceFormatError(
            f"{path}:1: neither Mooncake (field 'hash_ids') nor kvbench JSONL "
            f"(field 'session_id'); fields: {sorted(row)}"
        )
    raise TraceFormatError(f"{path}: empty trace")


TRACE_READERS = MappingProxyType({"mooncake": read_mooncake, "azure": read_azure, "kvbench": read_kvbench_jsonl})


def _kvbench_session(session_id: str, lines: _SessionLines, seed: int, token_range, time_scale: float):
    missing = sorted(set(range(len(lines.turns))) ^ set(lines.turns))
    if missing:
        raise TraceFormatError(
            f"{lines.first_where}: field 'turn': session {session_id!r} has turns "
            f"{sorted(lines.turns)}, expected 0..{len(lines.turns) - 1} without gaps"
        )
    where, first = lines.turns[0]
    arrival = _number(first, "arrival_s", where, minimum=0)
    tenant = first.get("tenant", "default")
    if not isinstance(tenant, str) or not tenant:
        raise TraceFormatError(f"{where}: field 'tenant' must be a non-empty string, got {tenant!r}")
    tier = first.get("tier", "basic")
    if tier not in ("premium", "basic"):
        raise TraceFormatError(f"{where}: field 'tier' must be 'premium' or 'basic', got {tier!r}")
    context = _tokens(first, "context", where, stable_key("kvbench-context", seed, session_id), token_range)
    turns = []
    for index in range(len(lines.turns)):
        where, row = lines.turns[index]
        if index > 0:
            for turn0_only in ("arrival_s", "tenant", "tier", "context_tokens", "context_length"):
                if turn0_only in row:
                    raise TraceFormatError(f"{where}: field '{turn0_only}' is only allowed on turn 0")
        think = _number(row, "think_time_s", where, minimum=0, default=0.0)
        if index == 0 and think != 0:
            raise TraceFormatError(f"{where}: field 'think_time_s' must be 0 on turn 0 (use arrival_s)")
        user = _tokens(row, "user", where, stable_key("kvbench-user", seed, session_id, index), token_range)
        if index == 0 and len(context) + len(user) == 0:
            raise TraceFormatError(
                f"{where}: field 'user_tokens' or 'context_tokens' (or a *_length) is "
                "required on turn 0: the first prompt cannot be empty"
            )
        max_tokens = _integer(row, "max_tokens", where, minimum=1)
        turns.append(Turn(user, max_tokens, think * time_scale))
    return Session(session_id, tenant, arrival * time_scale, context, tuple(turns)), tier


def _tokens(row: dict, part: str, where: str, key: int, token_range) -> np.ndarray:
    """`{part}_tokens` (explicit ids) or `{part}_length` (seeded random ids); empty when neither is given."""
    ids_field, length_field = f"{part}_tokens", f"{part}_length"
    if ids_field in row and length_field in row:
        raise TraceFormatError(f"{where}: field '{ids_field}' and '{length_field}' are both given; keep one")
    if ids_field in row:
        ids = row[ids_field]
        if not isinstance(ids, list) or not all(_is_int(t) and 0 <= t < 2**31 for t in ids):
            raise TraceFormatError(f"{where}: field '{ids_field}' must be a list of token ids (ints >= 0)")
        return token_array(ids)
    if length_field in row:
        return token_array(keyed_tokens(key, _integer(row, length_field, where, minimum=0), token_range))
    return _EMPTY


def _single_turn_sessions(rows: list, time_scale: float) -> tuple[Session, ...]:
    """One session per (time s, length, output, tokens) row, rebased to start at 0 and sorted by arrival."""
    if not rows:
        return ()
    start = min(row[0] for row in rows)
    sessions = [
        Session(f"r{index:06d}", "default", (time_s - start) * time_scale, tokens, (Turn(_EMPTY, output),))
        for index, (time_s, _, output, tokens) in enumerate(rows)
    ]
    sessions.sort(key=lambda s: s.arrival_s)  # stable: rows of equal time keep file order
    return tuple(sessions)


def _with_arrival(session: Session, arrival_s: float) -> Session:
    return Session(session.session_id, session.tenant, arrival_s, session.context, session.turns)


def _json_lines(path: str | Path, limit: int | None) -> Iterator[tuple[str, dict]]:
    """(`file:line`, object) for each non-blank line, up to `limit` objects."""
    count = 0
    with open(path, encoding="utf-8") as file, _text_errors(path):
        for number, line in enumerate(file, start=1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise TraceFormatError(f"{where}: not a JSON object ({error.msg})") from None
            if not isinstance(row, dict):
                raise TraceFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
            count += 1
            yield where, row


@contextmanager
def _text_errors(path: str | Path) -> Iterator[None]:
    """A binary or non-UTF-8 file, or a CSV with NUL bytes, as a TraceFormatError naming the file."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise TraceFormatError(
            f"{path}: not a UTF-8 text trace (byte {error.start}: {error.reason}); "
            "expected Mooncake/kvbench JSONL or Azure CSV"
        ) from None
    except csv.Error as error:
        raise TraceFormatError(f"{path}: not a CSV trace ({error})") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(row: dict, name: str, where: str, minimum: int, parse: bool = False) -> int:
    """An integer field in [minimum, MAX_TOKENS_PER_FIELD]."""
    if name not in row:
        raise TraceFormatError(f"{where}: field '{name}' is missing")
    value = row[name]
    if parse:
        try:
            value = int(value)
        except ValueError:
            raise TraceFormatError(f"{where}: field '{name}' must be an integer, got {row[name]!r:.40}") from None
    if not _is_int(value) or not minimum <= value <= MAX_TOKENS_PER_FIELD:
        raise TraceFormatError(
            f"{where}: field '{name}' must be an integer from {minimum} to {MAX_TOKENS_PER_FIELD:,} "
            f"(trace lengths are capped there), got {row[name]!r:.40}"
        )
    return value


def _number(row: dict, name: str, where: str, minimum: float, default: float | None = None) -> float:
    if name not in row:
        if default is not None:
            return default
        raise TraceFormatError(f"{where}: field '{name}' is missing")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise TraceFormatError(f"{where}: field '{name}' must be a number >= {minimum}, got {value!r}")
    return float(value)


def _wall_clock_ns(text: str, where: str) -> int:
    """Nanoseconds since the epoch (as UTC) of `YYYY-MM-DD HH:MM:SS[.fraction]`, fraction digits kept."""
    whole, _, fraction = text.strip().partition(".")
    try:
        seconds = int(datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp())
        if fraction and not fraction.isdigit():
            raise ValueError(fraction)
        return seconds * 10**9 + int((fraction or "0")[:9].ljust(9, "0"))
    except ValueError:
        raise TraceFormatError(
            f"{where}: field 'TIMESTAMP' must look like 2023-11-16 18:15:46.6805900, got {text!r}"
        ) from None


def _check_options(time_scale: float, limit: int | None) -> None:
    if not time_scale > 0:
        raise WorkloadError(f"time_scale must be > 0 (it multiplies inter-arrival times), got {time_scale}")
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise WorkloadError(f"limit must be an int >= 1 (rows to keep) or None, got {limit!r}")
