"""The one door for a server's streamed answer: each SSE payload is parsed here into a typed chunk, or a named
failure, and the figures a request's record gets are checked here where they are made.

Nothing past `parse_payload` calls `int()`, `.get()` or `len()` on the server's values; `AnswerReader` applies
the parsed chunks to a `RequestRecord` and checks the stream as it goes and when it ends. Every breach is a
failure with a reason that names the field and the value ("usage.prompt_tokens is 'lots', not an integer");
none is an exception. What is checked (`ERR_BAD_ANSWER` unless said):

    per field    types as OpenAI's stream has them; counts are integers in [0, max_context] (completion tokens
                 in [0, max_tokens]); token ids in [0, 2^31); finish_reason a short string
    per chunk    tokens streamed so far <= max_tokens ("server ignored max_tokens"): the stream is stopped
    at the end   some content arrived ("no content"); cached <= prompt tokens; prompt + completion tokens
                 <= max_context; usage agrees with the stream: within USAGE_TOLERANCE of the token ids
                 streamed, or, with text only, at least the text events (each carries >= 1 token)

A payload that is not a JSON object is `ERR_MALFORMED`; an `error` object without choices `ERR_SERVER`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvbench.measure.records import RequestRecord

API_COMPLETIONS = "completions"
API_CHAT = "chat"

ERR_MALFORMED = "malformed_sse"
ERR_SERVER = "server_error"
ERR_BAD_ANSWER = "bad_answer"  # the server answered, but not a possible answer: the point is invalid

DEFAULT_MAX_CONTEXT = 1 << 24  # tokens; more than any served model's context window today
MAX_TOKEN_ID = (1 << 31) - 1  # answers are kept as int32 token ids
MAX_FINISH_REASON_CHARS = 64
USAGE_TOLERANCE = 1  # tokens: an EOS token counted in usage but not streamed (or the reverse)


@dataclass(frozen=True)
class AnswerLimits:
    """Bounds of one request's answer: `max_tokens` as the request asked (None: not asked), `max_context` the
    most tokens a usage count may name."""

    max_tokens: int | None = None
    max_context: int = DEFAULT_MAX_CONTEXT


@dataclass(frozen=True)
class Failure:
    """Why an answer is unusable; `str()` is the record's error, `kind: reason`."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


@dataclass(frozen=True)
class Usage:
    """The server's `usage`; None: the field was not sent (missing is never 0)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cached_tokens_by_tier: dict[str, int] | None = None


@dataclass(frozen=True)
class Piece:
    """One choice of a chunk: its text, its token ids when sent, the tokens it carried, its finish reason."""

    text: str
    token_ids: tuple[int, ...] | None
    tokens: int
    finish_reason: str | None


@dataclass(frozen=True)
class Chunk:
    pieces: tuple[Piece, ...]
    usage: Usage | None


@dataclass(slots=True)
class StreamResult:
    """What the stream said about the answer, for building the next turn."""

    text: str = ""
    token_ids: list[int] | None = None


class _Bad(Exception):
    """A field's breach, raised inside the parse only (it never leaves this module)."""


def parse_payload(payload: str, api: str, limits: AnswerLimits) -> Chunk | Failure:
    """One SSE data payload (not `[DONE]`) as a chunk, or the failure that names what is wrong with it."""
    try:
        event = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return Failure(ERR_MALFORMED, f"{str(exc)[:120]}: {payload[:120]!r}")
    if not isinstance(event, dict):
        return Failure(ERR_MALFORMED, f"event is {_show(event)}, not a JSON object")
    choices = event.get("choices")
    if "error" in event and not choices:
        return Failure(ERR_SERVER, _show(event["error"], 300))
    try:
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise _Bad(f"choices is {_show(choices)}, not a list")
        pieces = tuple(_piece(choice, f"choices[{index}]", api) for index, choice in enumerate(choices))
        usage = event.get("usage")
        return Chunk(pieces, None if usage is None else _usage(usage, limits))
    except _Bad as bad:
        return Failure(ERR_BAD_ANSWER, str(bad))


def _piece(choice: object, name: str, api: str) -> Piece:
    choice = _object(choice, name)
    reasoning = ""
    if api == API_COMPLETIONS:
        text = _string(choice.get("text"), f"{name}.text")
    else:
        delta = _object(choice.get("delta", {}), f"{name}.delta", optional=True)
        text = _string(delta.get("content"), f"{name}.delta.content")
        # A reasoning model's thinking (vLLM's and SGLang's reasoning parsers): tokens, but not the answer text.
        for key in ("reasoning_content", "reasoning"):
            reasoning += _string(delta.get(key), f"{name}.delta.{key}")
    ids = choice.get("token_ids")
    token_ids = None
    if ids is not None:
        if not isinstance(ids, list):
            raise _Bad(f"{name}.token_ids is {_show(ids)}, not a list")
        token_ids = tuple(_count(token, f"{name}.token_ids[{k}]", MAX_TOKEN_ID, "the largest token id")
                          for k, token in enumerate(ids))
    logprob_tokens = _logprob_tokens(choice.get("logprobs"), f"{name}.logprobs")
    if token_ids:
        tokens = len(token_ids)
    elif text or reasoning:
        tokens = logprob_tokens or 1
    else:
        tokens = 0
    finish = choice.get("finish_reason")
    if finish is not None and (not isinstance(finish, str) or len(finish) > MAX_FINISH_REASON_CHARS):
        raise _Bad(f"{name}.finish_reason is {_show(finish)}, not a string of at most {MAX_FINISH_REASON_CHARS} characters")
    return Piece(text, token_ids, tokens, finish or None)


def _logprob_tokens(logprobs: object, name: str) -> int:
    """Tokens a text chunk carried, from its logprobs (completions' `tokens`, chat's `content`); 0: not said."""
    if logprobs is None:
        return 0
    logprobs = _object(logprobs, name)
    for key in ("tokens", "content"):
        values = logprobs.get(key)
        if values is not None:
            if not isinstance(values, list):
                raise _Bad(f"{name}.{key} is {_show(values)}, not a list")
            return len(values)
    return 0


def _usage(usage: object, limits: AnswerLimits) -> Usage:
    usage = _object(usage, "usage")
    context = (limits.max_context, f"the context bound {limits.max_context}")
    completion_bound = (limits.max_tokens, f"max_tokens {limits.max_tokens}") if limits.max_tokens is not None else context
    details = _object(usage.get("prompt_tokens_details"), "usage.prompt_tokens_details", optional=True)
    by_tier = details.get("cached_tokens_by_tier")
    tiers = None
    if by_tier is not None:
        by_tier = _object(by_tier, "usage.prompt_tokens_details.cached_tokens_by_tier")
        tiers = {tier: _count(count, f"usage.prompt_tokens_details.cached_tokens_by_tier.{tier[:40]}", *context)
                 for tier, count in by_tier.items()}
    return Usage(
        prompt_tokens=_optional_count(usage.get("prompt_tokens"), "usage.prompt_tokens", *context),
        completion_tokens=_optional_count(usage.get("completion_tokens"), "usage.completion_tokens", *completion_bound),
        cached_tokens=_optional_count(details.get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens", *context),
        cached_tokens_by_tier=tiers,
    )


def _object(value: object, name: str, optional: bool = False) -> dict:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise _Bad(f"{name} is {_show(value)}, not an object")
    return value


def _string(value: object, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Bad(f"{name} is {_show(value)}, not a string")
    return value


def _optional_count(value: object, name: str, bound: int, bound_name: str) -> int | None:
    return None if value is None else _count(value, name, bound, bound_name)


def _count(value: object, name: str, bound: int, bound_name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"{name} is {_show(value)}, not an integer")
    if value < 0:
        raise _Bad(f"{name} is {value}, below 0")
    if value > bound:
        raise _Bad(f"{name} is {_show(value)}, past {bound_name}")
    return value


def _show(value: object, limit: int = 60) -> str:
    """A value as the reason shows it, cut to `limit` characters, for any JSON value however deep."""
    if isinstance(value, str):
        text = repr(value[:limit])
    else:
        try:
            text = json.dumps(value)
        except (ValueError, RecursionError):
            text = type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."


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
    return _show(message, 300) if message else text[:300]


@dataclass(slots=True)
class AnswerReader:
    """One request's answer as it streams in: `take` each payload, then `finish` once the stream ended with
    [DONE]. Each returns None, or the failure that ends the request (the caller stops reading)."""

    api: str
    limits: AnswerLimits
    result: StreamResult = field(default_factory=StreamResult)
    streamed_tokens: int = 0
    usage: Usage | None = None

    def take(self, payload: str, arrival_ns: int, record: RequestRecord) -> Failure | None:
        chunk = parse_payload(payload, self.api, self.limits)
        if isinstance(chunk, Failure):
            return chunk
        if chunk.usage is not None:
            self.usage = chunk.usage
            _apply_usage(chunk.usage, record)
        for piece in chunk.pieces:
            self._add(piece, arrival_ns, record)
        max_tokens = self.limits.max_tokens
        if max_tokens is not None and self.streamed_tokens > max_tokens:
            return Failure(ERR_BAD_ANSWER, f"server ignored max_tokens: {self.streamed_tokens} tokens streamed, "
                                           f"max_tokens {max_tokens}")
        return None

    def finish(self, record: RequestRecord) -> Failure | None:
        if self.streamed_tokens == 0:
            return Failure(ERR_BAD_ANSWER, "no content: the stream ended without a token")
        usage = self.usage or Usage()
        prompt, completion, cached = usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
        if cached is not None and prompt is not None and cached > prompt:
            return Failure(ERR_BAD_ANSWER, f"usage.prompt_tokens_details.cached_tokens {cached} > usage.prompt_tokens {prompt}")
        tiers = sum((usage.cached_tokens_by_tier or {}).values())
        if prompt is not None and tiers > prompt:
            return Failure(ERR_BAD_ANSWER, f"cached_tokens_by_tier sum to {tiers} > usage.prompt_tokens {prompt}")
        if prompt is not None and completion is not None and prompt + completion > self.limits.max_context:
            return Failure(ERR_BAD_ANSWER, f"usage.prompt_tokens + completion_tokens = {prompt + completion}, "
                                           f"past the context bound {self.limits.max_context}")
        if completion is not None:
            ids = self.result.token_ids
            if ids is not None and abs(completion - len(ids)) > USAGE_TOLERANCE:
                return Failure(ERR_BAD_ANSWER, f"usage.completion_tokens {completion} disagrees with the {len(ids)} "
                                               f"token ids streamed (tolerance {USAGE_TOLERANCE})")
            if ids is None and completion < self.streamed_tokens:
                return Failure(ERR_BAD_ANSWER, f"usage.completion_tokens {completion} < the {self.streamed_tokens} "
                                               f"tokens of text streamed")
        return None

    def _add(self, piece: Piece, arrival_ns: int, record: RequestRecord) -> None:
        if piece.token_ids:
            if self.result.token_ids is None:
                self.result.token_ids = []
            self.result.token_ids.extend(piece.token_ids)
        self.result.text += piece.text
        if piece.tokens:
            self.streamed_tokens += piece.tokens
            if record.first_token_ns is None:
                record.first_token_ns = arrival_ns
            if record.chunks and record.chunks[-1][0] == arrival_ns:
                record.chunks[-1][1] += piece.tokens  # several events in one network read are one chunk
            else:
                record.chunks.append([arrival_ns, piece.tokens])
        if piece.finish_reason:
            record.finish_reason = piece.finish_reason


def _apply_usage(usage: Usage, record: RequestRecord) -> None:
    if usage.prompt_tokens is not None:
        record.prompt_tokens = usage.prompt_tokens
    if usage.completion_tokens is not None:
        record.output_tokens = usage.completion_tokens
    if usage.cached_tokens is not None:
        record.cached_tokens = usage.cached_tokens
    if usage.cached_tokens_by_tier is not None:
        record.cached_tokens_by_tier = dict(usage.cached_tokens_by_tier)


def breach_reason(records: Sequence[RequestRecord]) -> str | None:
    """Why a point is invalid because its server gave answers no server could give (`ERR_BAD_ANSWER`): the
    count and the most frequent breach; None when every answer passed the checks. One such answer is enough:
    a server that breaks them once may have misreported the others unseen."""
    breaches = Counter(record.error for record in records if record.error_kind == ERR_BAD_ANSWER)
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
