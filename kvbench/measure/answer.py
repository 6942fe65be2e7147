"""What the transport hands back for one request: an immutable `Answer` (its timestamps, the server's usage, the
streamed chunks, and a typed `Failure` or none). The HTTP client makes one per request, the simulator one per
simulated request; `record_builder` alone turns it into the run's `RequestRecord`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FailureKind(StrEnum):
    """Why a request failed; metrics count failures by kind, and a record carries its kind as this value."""

    HTTP = "http"
    CONNECTION = "connection"
    TIMEOUT = "timeout"
    STALLED = "stalled"
    INCOMPLETE = "incomplete_stream"
    MALFORMED = "malformed_sse"
    SERVER = "server_error"
    BAD_ANSWER = "bad_answer"  # the server answered, but not a possible answer: the point is invalid
    TOO_LONG = "too_long"  # the simulator's: the prompt never fit in the device KV cache


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an answer is unusable; `str()` is the record's `error`, `kind: reason`."""

    kind: FailureKind
    reason: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Usage:
    """The server's `usage`; None: the field was not sent (missing is never 0)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cached_tokens_by_tier: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """One request as the transport saw it. `chunks` holds `[arrival_ns, tokens]` per streamed chunk that carried
    tokens (the list is handed on to the record, never edited after); `text` and `token_ids` are what the stream
    said the answer was, for the next turn. A failed request's timings are partial; `done_ns` is None when it
    never ended on its own (a timeout, a lost connection)."""

    sent_ns: int | None = None
    http_status: int | None = None
    first_token_ns: int | None = None
    done_ns: int | None = None
    chunks: list[list[int]] | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    text: str = ""
    token_ids: list[int] | None = None
    failure: Failure | None = None
