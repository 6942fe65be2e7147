"""One SSE data payload of a server's stream as a typed chunk, or the failure that names what is wrong with it.

Each payload is decoded in one pass of typed decoding (msgspec Structs, which validate types and static bounds
while they parse), then its counts are held to the request's bounds. A payload may come as the bytes off the
wire (the client's path) or as text; only a payload that fails is decoded to text (invalid UTF-8 replaced) and
parsed again, so bytes and text get the same chunk or the same failure, with the same reason.
`stream_answer` collects the chunks of one request and says what is checked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated

import msgspec

from kvbench.measure.answer import Failure, FailureKind, Usage

API_COMPLETIONS = "completions"
API_CHAT = "chat"

DEFAULT_MAX_CONTEXT = 1 << 24  # tokens; more than any served model's context window today
MAX_TOKEN_ID = (1 << 31) - 1  # answers are kept as int32 token ids
MAX_FINISH_REASON_CHARS = 64


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


def parse_payload(payload: bytes | str, api: str, limits: AnswerLimits) -> Chunk | Failure:
    """One SSE data payload (not `[DONE]`) as a chunk, or the failure that names what is wrong with it."""
    try:
        event = _DECODERS[api].decode(payload)
    except msgspec.ValidationError as exc:
        if isinstance(payload, bytes):
            return parse_payload(payload.decode("utf-8", errors="replace"), api, limits)
        return _refused(payload, str(exc))
    except msgspec.DecodeError as exc:
        if isinstance(payload, bytes):
            return parse_payload(payload.decode("utf-8", errors="replace"), api, limits)
        return Failure(FailureKind.MALFORMED, f"{str(exc)[:120]}: {payload[:120]!r}")
    if event.error is not msgspec.UNSET and not event.choices:
        if isinstance(payload, bytes):  # the error shown as text, whatever bytes it holds
            return parse_payload(payload.decode("utf-8", errors="replace"), api, limits)
        return Failure(FailureKind.SERVER, shown(json.loads(bytes(event.error)), 300))
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
        raise _Bad(f"{name} is {shown(value)}, past {bound_name}")


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
    try:
        event = json.loads(payload)
    except (ValueError, RecursionError):  # refused before its end (`0` then junk): never one JSON value
        return Failure(FailureKind.MALFORMED, f"not one JSON value: {payload[:120]!r}")
    if where is None:  # the payload itself
        return Failure(FailureKind.MALFORMED, f"event is {shown(event)}, not a JSON object")
    if "error" in event and not event.get("choices"):
        return Failure(FailureKind.SERVER, shown(event["error"], 300))
    path = where.group(1).lstrip(".")
    value = _value_at(event, where.group(1))
    expected = _EXPECTED.match(message)
    what = _WORDS.get(expected.group(2) or expected.group(1), f"not {expected.group(1)}") if expected else message
    return Failure(FailureKind.BAD_ANSWER, f"{path} is {shown(value)}, {what}")


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


def shown(value: object, limit: int = 60) -> str:
    """A value as the reason shows it, cut to `limit` characters, for any JSON value however deep."""
    if isinstance(value, str):
        text = repr(value[:limit])
    else:
        try:
            text = json.dumps(value)
        except (ValueError, RecursionError):
            text = type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."
