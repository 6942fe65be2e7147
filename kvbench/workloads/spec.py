"""The workload contract: what a generator or a trace reader produces and what the load generator replays.

A workload is a set of sessions. A session has a fixed context (system prompt and retrieved documents) and
one or more turns. The prompt of turn k is built at run time, because it carries the engine's real answers:

    prompt(k) = context + user(0) + answer(0) + user(1) + answer(1) + ... + user(k)

A trace request is a session of one turn whose context is the whole prompt and whose user tokens are empty.

Token ids are 1-D read-only numpy int32 arrays so that a trace of millions of tokens stays compact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

TOKEN_DTYPE = np.int32


class WorkloadError(ValueError):
    """A workload name, parameter or file that cannot be used; the message names the field and the fix."""


def token_array(values) -> np.ndarray:
    """A read-only int32 token array from any sequence of ints (shares memory when already int32)."""
    array = np.ascontiguousarray(values, dtype=TOKEN_DTYPE)
    if array.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {array.shape}")
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Turn:
    """One request of a session.

    `think_time_s` is the pause between the end of the previous turn and this one's send time (0 for turn 0).
    `max_tokens` is the output length asked for; the load generator asks engines to ignore EOS where they can
    so that output lengths follow the workload, not the model.
    """

    user_tokens: np.ndarray
    max_tokens: int
    think_time_s: float = 0.0


@dataclass(frozen=True, eq=False)
class Session:
    """A conversation of one tenant. `arrival_s` is the first turn's offset from the start of the run."""

    session_id: str
    tenant: str
    arrival_s: float
    context: np.ndarray
    turns: tuple[Turn, ...]

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"session {self.session_id} has no turns")


@dataclass(frozen=True)
class TenantSpec:
    """A tenant of a multi-tenant mix. `share` is its fraction of sessions; `tier` is `premium` or `basic`."""

    name: str
    share: float = 1.0
    tier: str = "basic"


@dataclass(frozen=True, eq=False)
class Workload:
    """Sessions sorted by arrival, plus the parameters that made them (saved with every run's results)."""

    name: str
    sessions: tuple[Session, ...]
    vocab_size: int
    tenants: tuple[TenantSpec, ...] = (TenantSpec("default"),)
    params: Mapping[str, object] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(session.turns) for session in self.sessions)
