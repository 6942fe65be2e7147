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

kvbench's own JSONL (multi-turn sessions, with its writer) is `kvbench_jsonl.py`'s; the fields every format
reads, and `TraceFormatError`, are `trace_fields.py`'s.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import MappingProxyType

import numpy as np

from kvbench.workloads.kvbench_jsonl import read_kvbench_jsonl
from kvbench.workloads.spec import Session, TenantSpec, Turn, Workload, token_array
from kvbench.workloads.tokens import DEFAULT_VOCAB_SIZE, keyed_tokens, safe_token_range, stable_key
from kvbench.workloads.trace_fields import (
    NO_TOKENS,
    TraceFormatError,
    check_options,
    integer_field,
    is_int,
    json_lines,
    number_field,
    text_errors,
    wall_clock_ns,
)

MOONCAKE_BLOCK_TOKENS = 512
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_mooncake(
    path: str | Path,
    *,
    seed: int = 0,
    time_scale: float = 1.0,
    limit: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Workload:
    """A Mooncake JSONL trace: one single-turn session per request, block hashes mapped to token blocks."""
    check_options(time_scale, limit)
    token_range = safe_token_range(vocab_size)
    domain = stable_key("mooncake-block", seed)
    rows = []
    for where, row in json_lines(path, limit):
        timestamp = number_field(row, "timestamp", where, minimum=0)
        length = integer_field(row, "input_length", where, minimum=1)
        output = integer_field(row, "output_length", where, minimum=1)
        hash_ids = row.get("hash_ids")
        blocks = math.ceil(length / MOONCAKE_BLOCK_TOKENS)
        if not isinstance(hash_ids, list) or not all(is_int(h) and h >= 0 for h in hash_ids):
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
    return _single_turn_workload(path, "mooncake", rows, seed, time_scale, limit, vocab_size)


def read_azure(
    path: str | Path,
    *,
    seed: int = 0,
    time_scale: float = 1.0,
    limit: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Workload:
    """An Azure LLM inference CSV trace: one single-turn session per row with a unique random prompt."""
    check_options(time_scale, limit)
    token_range = safe_token_range(vocab_size)
    rows = []
    first_ns = None
    with open(path, newline="", encoding="utf-8") as file, text_errors(path):
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
            timestamp_ns = wall_clock_ns(record["TIMESTAMP"], where)
            first_ns = timestamp_ns if first_ns is None else first_ns
            length = integer_field(record, "ContextTokens", where, minimum=1, parse=True)
            output = integer_field(record, "GeneratedTokens", where, minimum=1, parse=True)
            tokens = keyed_tokens(stable_key("azure-row", seed, len(rows)), length, token_range)
            rows.append(((timestamp_ns - first_ns) / 1e9, length, output, token_array(tokens)))
    return _single_turn_workload(path, "azure", rows, seed, time_scale, limit, vocab_size)


def sniff_trace_format(path: str | Path) -> str:
    """`mooncake`, `kvbench` or `azure` from the extension and the first record; TraceFormatError otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix != ".jsonl":
        raise TraceFormatError(f"{path}: not a trace (expected .jsonl for Mooncake or kvbench JSONL, .csv for Azure)")
    for _, row in json_lines(path, 1):
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


def _single_turn_workload(
    path: str | Path, trace_format: str, rows: list, seed: int, time_scale: float, limit: int | None, vocab_size: int
) -> Workload:
    """One single-turn session per (time s, length, output, tokens) row, rebased to start at 0 and sorted by
    arrival, in one default tenant; the options are kept in the workload's source."""
    sessions = []
    if rows:
        start = min(row[0] for row in rows)
        sessions = [
            Session(f"r{index:06d}", "default", (time_s - start) * time_scale, tokens, (Turn(NO_TOKENS, output),))
            for index, (time_s, _, output, tokens) in enumerate(rows)
        ]
        sessions.sort(key=lambda s: s.arrival_s)  # stable: rows of equal time keep file order
    source = {"trace": str(path), "format": trace_format, "seed": seed, "time_scale": time_scale, "limit": limit}
    return Workload(Path(path).name, tuple(sessions), vocab_size, (TenantSpec("default"),), source)
