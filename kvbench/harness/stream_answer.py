"""The one door for a server's streamed answer: each SSE payload is parsed here into a typed chunk, or a named
failure, and the figures a request's record gets are checked here where they are made.

Each payload is decoded in one pass of typed decoding (`answer_decode`: msgspec Structs, which validate types and
static bounds while they parse, from the wire's bytes), then its counts are held to the request's bounds. Nothing past `parse_payload` calls `int()`,
`.get()` or `len()` on the server's values; `AnswerReader` collects the parsed chunks (timestamps, usage, text,
token ids) and checks the stream as it goes and when it ends; the client hands what it collected on as an
`Answer`. Every breach is a failure with a reason that names the field and the value ("usage.prompt_tokens is
'lots', not an integer"); none is an exception. What is checked (`BAD_ANSWER` unless said):

    per field    types as OpenAI's stream has them; counts are integers in [0, max_context] (completion tokens
                 in [0, max_tokens]); token ids in [0, 2^31); finish_reason a short string
    per chunk    tokens streamed so far <= max_tokens ("server ignored max_tokens"): the stream is stopped
    at the end   some content arrived ("no content"); cached <= prompt tokens; prompt + completion tokens
                 <= max_context; usage agrees with the stream: within USAGE_TOLERANCE of the token ids
                 streamed, or, with text only, at least the text events (each carries >= 1 token)

A payload that is not a JSON object is `MALFORMED`; an `error` object without choices `SERVER`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvbench.harness.answer_decode import (
    API_CHAT,
    API_COMPLETIONS,
    DEFAULT_MAX_CONTEXT,
    AnswerLimits,
    Chunk,
    parse_payload,
    shown,
)
from kvbench.measure.answer import Answer, Failure, FailureKind, Usage
from kvbench.measure.records import RequestRecord

USAGE_TOLERANCE = 1  # tokens: an EOS token counted in usage but not streamed (or the reverse)

__all__ = [
    "API_CHAT",
    "API_COMPLETIONS",
    "DEFAULT_MAX_CONTEXT",
    "AnswerLimits",
    "AnswerReader",
    "Chunk",
    "Failure",
    "Usage",
    "breach_reason",
    "error_message",
    "parse_payload",
    "stated_context",
]


def error_message(text: str) -> str:
    """An HTTP error body's `error.message` (OpenAI's shape) when it has one, else its first 300 characters."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return text[:300]
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if isinstance(message, str) and message:
        return message[:300]
    return shown(message, 300) if message else text[:300]


@dataclass(slots=True)
class AnswerReader:
    """One request's answer as it streams in: `take` each payload, then `finish` once the stream ended with
    [DONE]. Each returns None, or the failure that ends the request (the caller stops reading). What it read
    so far is `answer()`. (`record`, still accepted by take and finish, is not touched: the record is built
    from the answer, in `measure.record_builder`.)"""

    api: str
    limits: AnswerLimits
    text: str = ""
    token_ids: list[int] | None = None
    streamed_tokens: int = 0
    first_token_ns: int | None = None
    chunks: list[list[int]] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None

    def take(self, payload: bytes | str, arrival_ns: int, record: RequestRecord | None = None) -> Failure | None:
        chunk = parse_payload(payload, self.api, self.limits)
        if isinstance(chunk, Failure):
            return chunk
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.token_ids:
            if self.token_ids is None:
                self.token_ids = []
            self.token_ids.extend(chunk.token_ids)
        if chunk.text:
            self.text += chunk.text
        if chunk.tokens:
            self.streamed_tokens += chunk.tokens
            if self.first_token_ns is None:
                self.first_token_ns = arrival_ns
            chunks = self.chunks
            if chunks and chunks[-1][0] == arrival_ns:
                chunks[-1][1] += chunk.tokens  # several events in one network read are one chunk
            else:
                chunks.append([arrival_ns, chunk.tokens])
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
        max_tokens = self.limits.max_tokens
        if max_tokens is not None and self.streamed_tokens > max_tokens:
            return Failure(
                FailureKind.BAD_ANSWER,
                f"server ignored max_tokens: {self.streamed_tokens} tokens streamed, max_tokens {max_tokens}",
            )
        return None

    def finish(self, record: RequestRecord | None = None) -> Failure | None:
        if self.streamed_tokens == 0:
            return Failure(FailureKind.BAD_ANSWER, "no content: the stream ended without a token")
        usage = self.usage or Usage()
        prompt, completion, cached = usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
        if cached is not None and prompt is not None and cached > prompt:
            return _bad(f"usage.prompt_tokens_details.cached_tokens {cached} > usage.prompt_tokens {prompt}")
        tiers = sum((usage.cached_tokens_by_tier or {}).values())
        if prompt is not None and tiers > prompt:
            return _bad(f"cached_tokens_by_tier sum to {tiers} > usage.prompt_tokens {prompt}")
        if prompt is not None and completion is not None and prompt + completion > self.limits.max_context:
            return _bad(
                f"usage.prompt_tokens + completion_tokens = {prompt + completion}, "
                f"past the context bound {self.limits.max_context}"
            )
        if completion is not None:
            ids = self.token_ids
            if ids is not None and abs(completion - len(ids)) > USAGE_TOLERANCE:
                return _bad(
                    f"usage.completion_tokens {completion} disagrees with the {len(ids)} "
                    f"token ids streamed (tolerance {USAGE_TOLERANCE})"
                )
            if ids is None and completion < self.streamed_tokens:
                return _bad(
                    f"usage.completion_tokens {completion} < the {self.streamed_tokens} tokens of text streamed"
                )
        return None

    def answer(
        self, sent_ns: int | None, http_status: int | None, done_ns: int | None, failure: Failure | None
    ) -> Answer:
        """What was read, as the transport hands it on: sent at `sent_ns`, ended at `done_ns`, failed or not."""
        return Answer(
            sent_ns=sent_ns,
            http_status=http_status,
            first_token_ns=self.first_token_ns,
            done_ns=done_ns,
            chunks=self.chunks,
            usage=self.usage,
            finish_reason=self.finish_reason,
            text=self.text,
            token_ids=self.token_ids,
            failure=failure,
        )


def _bad(reason: str) -> Failure:
    return Failure(FailureKind.BAD_ANSWER, reason)


def breach_reason(records: Sequence[RequestRecord]) -> str | None:
    """Why a point is invalid because its server gave answers no server could give (`BAD_ANSWER`): the
    count and the most frequent breach; None when every answer passed the checks. One such answer is enough:
    a server that breaks them once may have misreported the others unseen."""
    breaches = Counter(record.error for record in records if record.error_kind == FailureKind.BAD_ANSWER)
    if not breaches:
        return None
    error, times = breaches.most_common(1)[0]
    count = sum(breaches.values())
    example = error if times == count else f"most often ({times}x): {error}"
    return f"server answers failed the client's checks: {count}/{len(records)} requests ({example})"


def stated_context(models_body: str, model: str) -> int | None:
    """The context window a server states for `model` in its /v1/models answer (`max_model_len`, as vLLM and
    our engine send it; a server that lists one model serves that one whatever it is called), or None when
    it states none that is a positive integer."""
    try:
        body = json.loads(models_body)
    except (ValueError, RecursionError):
        return None
    entries = body.get("data") if isinstance(body, dict) else None
    entries = [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []
    named = [entry for entry in entries if entry.get("id") == model] or (entries if len(entries) == 1 else [])
    value = named[0].get("max_model_len") if named else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, DEFAULT_MAX_CONTEXT)
    return None
