"""kvbench JSONL, one turn per line; the lines of a session share `session_id` (any line order):
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

Options as for every trace reader (`traces.py`): `time_scale`, `limit` (the first sessions by arrival),
`vocab_size`, `seed` (the random ids of a `*_length`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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
    check_options(time_scale, limit)
    token_range = safe_token_range(vocab_size)
    grouped: dict[str, _SessionLines] = {}
    for where, row in json_lines(path, None):
        session_id = row.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            raise TraceFormatError(f"{where}: field 'session_id' must be a non-empty string, got {session_id!r}")
        turn = integer_field(row, "turn", where, minimum=0)
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


def _kvbench_session(session_id: str, lines: _SessionLines, seed: int, token_range, time_scale: float):
    missing = sorted(set(range(len(lines.turns))) ^ set(lines.turns))
    if missing:
        raise TraceFormatError(
            f"{lines.first_where}: field 'turn': session {session_id!r} has turns "
            f"{sorted(lines.turns)}, expected 0..{len(lines.turns) - 1} without gaps"
        )
    where, first = lines.turns[0]
    arrival = number_field(first, "arrival_s", where, minimum=0)
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
        think = number_field(row, "think_time_s", where, minimum=0, default=0.0)
        if index == 0 and think != 0:
            raise TraceFormatError(f"{where}: field 'think_time_s' must be 0 on turn 0 (use arrival_s)")
        user = _tokens(row, "user", where, stable_key("kvbench-user", seed, session_id, index), token_range)
        if index == 0 and len(context) + len(user) == 0:
            raise TraceFormatError(
                f"{where}: field 'user_tokens' or 'context_tokens' (or a *_length) is "
                "required on turn 0: the first prompt cannot be empty"
            )
        max_tokens = integer_field(row, "max_tokens", where, minimum=1)
        turns.append(Turn(user, max_tokens, think * time_scale))
    return Session(session_id, tenant, arrival * time_scale, context, tuple(turns)), tier


def _tokens(row: dict, part: str, where: str, key: int, token_range) -> np.ndarray:
    """`{part}_tokens` (explicit ids) or `{part}_length` (seeded random ids); empty when neither is given."""
    ids_field, length_field = f"{part}_tokens", f"{part}_length"
    if ids_field in row and length_field in row:
        raise TraceFormatError(f"{where}: field '{ids_field}' and '{length_field}' are both given; keep one")
    if ids_field in row:
        ids = row[ids_field]
        if not isinstance(ids, list) or not all(is_int(t) and 0 <= t < 2**31 for t in ids):
            raise TraceFormatError(f"{where}: field '{ids_field}' must be a list of token ids (ints >= 0)")
        return token_array(ids)
    if length_field in row:
        return token_array(keyed_tokens(key, integer_field(row, length_field, where, minimum=0), token_range))
    return NO_TOKENS


def _with_arrival(session: Session, arrival_s: float) -> Session:
    return Session(session.session_id, session.tenant, arrival_s, session.context, session.turns)
