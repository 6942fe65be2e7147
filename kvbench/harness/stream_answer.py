"""The one door for a server's streamed answer: each SSE payload is parsed here into a typed chunk, or a named
failure, and the figures a request's record gets are checked here where they are made.

Each payload is decoded in one pass of typed decoding (msgspec Structs, which validate types and static bounds
while they parse), then its counts are held to the request's bounds. Nothing past `parse_payload` calls `int()`,
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
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from kvbench.measure.answer import Answer, Failure, FailureKind, Usage
from kvbench.measure.records import RequestRecord

API_COMPLETIONS = "completions"
API_CHAT = "chat"

DEFAULT_MAX_CONTEXT = 1 << 24  # tokens; more than any served model's context window today
MAX_TOKEN_ID = (1 << 31) - 1  # answers are kept as int32 token ids
MAX_FINISH_REASON_CHARS = 64
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


@dataclass(frozen=True)
class AnswerLimits:
    """Bounds of one request's answer: `max_tokens` as the request asked (None: not asked), `max_context` the
    most tokens a usage count may name."""

    max_tokens: int | None = None
    max_context: int = DEFAULT_MAX_CONTEXT


# The stream's shape as OpenAI's has it, for the decoder: what is declared is typed and bounded as it is parsed;
# any other field is skipped unread. Counts' upper bounds depend on the request, so they are held after.
_Count = Annotated[int, msgspec.Meta(ge=0)]
_TokenId = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]
_FinishReason = Annotated[str, msgspec.Meta(max_length=MAX_FINISH_REASON_CHARS)]


class _Details(msgspec.Struct):
    cached_tokens: _Count | None = None
    cached_tokens_by_tier: dict[str, _Count] | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    prompt_tokens_details: _Details | None = None


class _Logprobs(msgspec.Struct):
    tokens: list[msgspec.Raw] | None = None  # completions: one entry per token
    content: list[msgspec.Raw] | None = None  # chat: one entry per token


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None  # a reasoning model's thinking (vLLM's and SGLang's reasoning parsers)
    reasoning: str | None = None


class _CompletionChoice(msgspec.Struct):
    text: str | None = None
    token_ids: list[_TokenId] | None = None
    finish_reason: _FinishReason | None = None
    logprobs: _Logprobs | None = None


class _ChatChoice(msgspec.Struct):
    delta: _Delta | None = None
    token_ids: list[_TokenId] | None = None
    finish_reason: _FinishReason | None = None
    logprobs: _Logprobs | None = None


class _CompletionEvent(msgspec.Struct):
    choices: list[_CompletionChoice] | None = None
    usage: _Usage | None = None
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _ChatEvent(msgspec.Struct):
    choices: list[_ChatChoice] | None = None
    usage: _Usage | None = None
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_DECODERS = {API_COMPLETIONS: msgspec.json.Decoder(_CompletionEvent), API_CHAT: msgspec.json.Decoder(_ChatEvent)}


@dataclass(frozen=True, slots=True)
class Chunk:
    """One event's choices together: their text, their token ids when sent, the tokens they carried, the last
    finish reason; and the usage when the event had one."""

    text: str
    token_ids: list[int] | None
    tokens: int
    finish_reason: str | None
    usage: Usage | None


def parse_payload(payload: str, api: str, limits: AnswerLimits) -> Chunk | Failure:
    """One SSE data payload (not `[DONE]`) as a chunk, or the failure that names what is wrong with it."""
    try:
        event = _DECODERS[api].decode(payload)
    except msgspec.ValidationError as exc:
        return _refused(payload, str(exc))
    except msgspec.DecodeError as exc:
        return Failure(FailureKind.MALFORMED, f"{str(exc)[:120]}: {payload[:120]!r}")
    if event.error is not msgspec.UNSET and not event.choices:
        return Failure(FailureKind.SERVER, _show(json.loads(bytes(event.error)), 300))
    try:
        usage = None if event.usage is None else _usage(event.usage, limits)
    except _Bad as bad:
        return Failure(FailureKind.BAD_ANSWER, str(bad))
    choices = event.choices
    if not choices:
        return Chunk("", None, 0, None, usage)
    if len(choices) == 1:  # the stream's usual event: one choice
        return _chunk(choices[0], api, usage)
    pieces = [_chunk(choice, api, None) for choice in choices]
    ids = [token for piece in pieces for token in piece.token_ids or ()]
    finish = [piece.finish_reason for piece in pieces if piece.finish_reason]
    return Chunk(
        "".join(piece.text for piece in pieces),
        ids or None,
        sum(piece.tokens for piece in pieces),
        finish[-1] if finish else None,
        usage,
    )


def _chunk(choice: _CompletionChoice | _ChatChoice, api: str, usage: Usage | None) -> Chunk:
    if api == API_COMPLETIONS:
        text, thought = choice.text or "", False
    else:
        delta = choice.delta
        text = (delta.content or "") if delta is not None else ""
        thought = delta is not None and bool(delta.reasoning_content or delta.reasoning)
    ids = choice.token_ids
    if ids:
        tokens = len(ids)
    elif text or thought:
        logprobs = choice.logprobs
        said = (
            logprobs.tokens
            if logprobs is not None and logprobs.tokens is not None
            else (logprobs.content if logprobs is not None else None)
        )
        tokens = len(said) if said else 1
    else:
        tokens = 0
    return Chunk(text, ids, tokens, choice.finish_reason or None, usage)


class _Bad(Exception):
    """A count past the request's bounds, raised inside the parse only (it never leaves this module)."""


def _usage(usage: _Usage, limits: AnswerLimits) -> Usage:
    context = limits.max_context
    completion_bound, completion_name = (
        (limits.max_tokens, f"max_tokens {limits.max_tokens}")
        if limits.max_tokens is not None
        else (context, f"the context bound {context}")
    )
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    tiers = details.cached_tokens_by_tier if details is not None else None
    _bounded(usage.prompt_tokens, "usage.prompt_tokens", context, f"the context bound {context}")
    _bounded(usage.completion_tokens, "usage.completion_tokens", completion_bound, completion_name)
    _bounded(cached, "usage.prompt_tokens_details.cached_tokens", context, f"the context bound {context}")
    for tier, count in (tiers or {}).items():
        _bounded(
            count,
            f"usage.prompt_tokens_details.cached_tokens_by_tier.{tier[:40]}",
            context,
            f"the context bound {context}",
        )
    return Usage(usage.prompt_tokens, usage.completion_tokens, cached, tiers)


def _bounded(value: int | None, name: str, bound: int, bound_name: str) -> None:
    if value is not None and value > bound:
        raise _Bad(f"{name} is {_show(value)}, past {bound_name}")


# What the decoder's "Expected `TYPE`[ CONSTRAINT]" says, in the reason's words.
_EXPECTED = re.compile(r"Expected `(\w+)[^`]*`( >= 0| <=| of length)?")
_WORDS = {
    "int": "not an integer",
    "str": "not a string",
    "array": "not a list",
    "object": "not an object",
    " >= 0": "below 0",
    " <=": "past the largest token id",
    " of length": f"not a string of at most {MAX_FINISH_REASON_CHARS} characters",
}
_AT = re.compile(r" - at `\$(.*)`$")
_STEP = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")


def _refused(payload: str, message: str) -> Failure:
    """The decoder's refusal as a named failure: the field (its path), its value and what it is not. Only a
    refused payload is parsed again, untyped, for the value to show."""
    where = _AT.search(message)
    event = json.loads(payload)
    if where is None:  # the payload itself
        return Failure(FailureKind.MALFORMED, f"event is {_show(event)}, not a JSON object")
    if "error" in event and not event.get("choices"):
        return Failure(FailureKind.SERVER, _show(event["error"], 300))
    path = where.group(1).lstrip(".")
    value = _value_at(event, where.group(1))
    expected = _EXPECTED.match(message)
    what = _WORDS.get(expected.group(2) or expected.group(1), f"not {expected.group(1)}") if expected else message
    return Failure(FailureKind.BAD_ANSWER, f"{path} is {_show(value)}, {what}")


def _value_at(event: object, path: str) -> object:
    """The value at a decoder's path (`.usage.prompt_tokens`, `.choices[0].token_ids[1]`); a dict entry the
    path does not name (`[...]`) is its first value that is not a count."""
    value = event
    for key, index in _STEP.findall(path):
        if key:
            value = value[key]
        elif index == "...":
            value = next(v for v in value.values() if not isinstance(v, int) or isinstance(v, bool) or v < 0)
        else:
            value = value[int(index)]
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

    def take(self, payload: str, arrival_ns: int, record: RequestRecord | None = None) -> Failure | None:
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
