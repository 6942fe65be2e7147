"""One streamed request to an OpenAI-compatible server, timed token by token.

`/v1/completions` carries token-id prompts (exact prefix structure); `/v1/chat/completions` carries text.
Both stream with `stream_options.include_usage`, so token counts come from the server's `usage`. A request
comes back as an immutable `Answer` (timestamps, usage, chunks, and a typed failure or none); every failure mode
(HTTP error, malformed SSE, an answer no server could give, stall, timeout, lost connection) is its `failure`,
never an exception out of here and never a hang. The answer's fields are parsed and checked in `stream_answer`,
the one door for them; `measure.record_builder` makes the record from the answer.

A request is watched in three phases, each with its own limit, inside `request_timeout_s` for the whole:

    sent ──header_timeout_s──> headers ──first_byte_timeout_s──> first byte ──stall_timeout_s──> ... [DONE]
                                                                  (and between every two reads after it)

OpenAI-compatible servers (vLLM, SGLang, ours) send headers before they schedule the prompt, so a server that
sends none is hung; the first byte waits for queueing and prefill, which is why its limit is the long one.
"""

from __future__ import annotations

import asyncio
import time
from asyncio import timeout_at
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from kvbench.harness.sse import DEFAULT_MAX_EVENT_BYTES, EventTooLarge, SSEParser, is_done
from kvbench.harness.stream_answer import (
    API_CHAT,
    API_COMPLETIONS,
    DEFAULT_MAX_CONTEXT,
    AnswerLimits,
    AnswerReader,
    error_message,
)
from kvbench.measure.answer import Answer, Failure, FailureKind

APIS = (API_COMPLETIONS, API_CHAT)
__all__ = ["APIS", "API_CHAT", "API_COMPLETIONS", "EndpointConfig", "chat_body", "completions_body", "stream_request"]

_ERROR_BODY_BYTES = 1 << 16  # of an HTTP error's body, read for its message


@dataclass(frozen=True)
class EndpointConfig:
    """Where and how to send. `extra_body` is merged into every request body (engine-specific fields).

    `request_timeout_s` bounds a whole request; `header_timeout_s` the wait for response headers,
    `first_byte_timeout_s` the silence from the headers to the first body byte, and `stall_timeout_s` the silence
    between two reads after that. `max_event_bytes` bounds one SSE event, `max_context_tokens` the counts a
    server's usage may name (see `stream_answer`).
    `ignore_eos` asks vLLM/SGLang-style servers to generate exactly `max_tokens`, so output lengths follow
    the workload rather than the model.
    """

    base_url: str
    model: str
    api: str = API_COMPLETIONS
    api_key: str | None = None
    request_timeout_s: float = 600.0
    header_timeout_s: float = 60.0
    first_byte_timeout_s: float = 300.0
    stall_timeout_s: float = 120.0
    ignore_eos: bool = True
    return_token_ids: bool = True
    extra_body: Mapping[str, object] = field(default_factory=dict)
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    max_context_tokens: int = DEFAULT_MAX_CONTEXT

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api: unknown value {self.api!r}; use one of {', '.join(APIS)}")

    @property
    def url(self) -> str:
        path = "/v1/completions" if self.api == API_COMPLETIONS else "/v1/chat/completions"
        return self.base_url.rstrip("/") + path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def completions_body(config: EndpointConfig, prompt: Sequence[int], max_tokens: int) -> dict:
    body = {
        "model": config.model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return _common(config, body)


def chat_body(config: EndpointConfig, messages: list[dict], max_tokens: int) -> dict:
    body = {
        "model": config.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return _common(config, body)


def _common(config: EndpointConfig, body: dict) -> dict:
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.return_token_ids:
        body["return_token_ids"] = True  # vLLM's field; our engine honours it too
    body.update(config.extra_body)
    return body


# What a request waits for while a deadline is armed: the failure named if that deadline passes.
_HEADERS, _FIRST_BYTE, _STALL, _WHOLE = range(4)


@dataclass(slots=True)
class _Exchange:
    """One request's progress on the wire, beside what `AnswerReader` read of its body. `deadline` (the event
    loop's clock) ends the whole request; `waiting` is what the deadline armed last waits for (`_HEADERS`, ...)."""

    reader: AnswerReader
    deadline: float
    waiting: int = _HEADERS
    sent_ns: int | None = None
    http_status: int | None = None
    done_ns: int | None = None
    failure: Failure | None = None

    def fail(self, kind: FailureKind, reason: str) -> None:
        self.failure = Failure(kind, reason)

    def until(self, start: float, limit_s: float, waiting: int) -> float:
        """The deadline of a wait for `waiting` of `limit_s` from `start`, or the whole request's deadline if
        that comes first; `self.waiting` says which it is."""
        end = start + limit_s
        if end < self.deadline:
            self.waiting = waiting
            return end
        self.waiting = _WHOLE
        return self.deadline


def _expired(config: EndpointConfig, waiting: int) -> Failure:
    """The failure of a request whose deadline passed while it waited for `waiting`."""
    if waiting == _HEADERS:
        return Failure(FailureKind.TIMEOUT, f"no response headers within {config.header_timeout_s:g} s")
    if waiting == _FIRST_BYTE:
        return Failure(
            FailureKind.TIMEOUT, f"no first byte within {config.first_byte_timeout_s:g} s of the response headers"
        )
    if waiting == _STALL:
        return Failure(FailureKind.STALLED, f"no bytes for {config.stall_timeout_s:g} s")
    return Failure(FailureKind.TIMEOUT, f"no complete answer within {config.request_timeout_s:g} s")


async def stream_request(session: aiohttp.ClientSession, config: EndpointConfig, body: dict) -> Answer:
    """Send `body`, stream the answer, and return it: timestamps, counts, chunks, and its failure or none.

    The answer is read through `AnswerReader` with `body`'s max_tokens as its bound: whatever the server sends,
    the request ends with an answer, complete or failed for one named reason, never with an exception.
    Deadlines are `timeout_at` blocks (no task per read, as `wait_for` made on 3.11), none past
    `request_timeout_s` from the send."""
    max_tokens = body.get("max_tokens")
    limits = AnswerLimits(max_tokens if isinstance(max_tokens, int) else None, config.max_context_tokens)
    deadline = asyncio.get_running_loop().time() + config.request_timeout_s
    exchange = _Exchange(AnswerReader(config.api, limits), deadline)
    exchange.sent_ns = time.perf_counter_ns()
    try:
        await _stream(session, config, body, exchange)
    except asyncio.TimeoutError:
        if exchange.failure is None:
            exchange.failure = _expired(config, exchange.waiting)
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        exchange.fail(FailureKind.CONNECTION, f"{type(exc).__name__}: {exc}")
    if exchange.failure is None and exchange.done_ns is None:
        exchange.done_ns = time.perf_counter_ns()
    return exchange.reader.answer(exchange.sent_ns, exchange.http_status, exchange.done_ns, exchange.failure)


async def _stream(session: aiohttp.ClientSession, config: EndpointConfig, body: dict, exchange: _Exchange) -> None:
    now = asyncio.get_running_loop().time()
    async with timeout_at(exchange.until(now, config.header_timeout_s, _HEADERS)):
        response = await session.post(config.url, json=body, headers=config.headers())
    async with response:
        exchange.http_status = response.status
        if response.status >= 400:
            async with timeout_at(exchange.deadline):
                exchange.waiting = _WHOLE
                text = (await response.content.read(_ERROR_BODY_BYTES)).decode("utf-8", errors="replace")
            exchange.fail(FailureKind.HTTP, f"{response.status} {error_message(text)}")
            exchange.done_ns = time.perf_counter_ns()
            return
        ended = False
        try:
            ended = await _read_events(response, config, exchange)
        finally:
            if not ended:
                response.close()  # stop the answer now: the rest of it is not read (nor waited for)


async def _read_events(response: aiohttp.ClientResponse, config: EndpointConfig, exchange: _Exchange) -> bool:
    """Parse the SSE body into `exchange.reader`; the first byte may take `first_byte_timeout_s`, and after it
    no silence may last `stall_timeout_s` (a passed deadline raises out of here). False (with
    `exchange.failure` set) when the request failed before the stream's end.

    The stall deadline is not moved at every read: armed `stall_timeout_s` after a read, it passes while later
    reads came, and only then is the next one armed from the last read (so a request arms one deadline per
    `stall_timeout_s` of streaming, not one per read). A read cut by a deadline loses no bytes: they stay in
    the response's buffer for the next read."""
    parser = SSEParser(config.max_event_bytes)
    take = exchange.reader.take
    loop = asyncio.get_running_loop()
    chunks = response.content.iter_any()
    finished = False
    limit_s, waiting = config.first_byte_timeout_s, _FIRST_BYTE
    last = loop.time()
    while True:
        armed_from = last
        try:
            async with timeout_at(exchange.until(last, limit_s, waiting)) as timeout:
                async for data in chunks:
                    last = loop.time()
                    if waiting == _FIRST_BYTE:  # the stall's limit from now on, which may pass sooner
                        limit_s, waiting, armed_from = config.stall_timeout_s, _STALL, last
                        timeout.reschedule(exchange.until(last, limit_s, waiting))
                    try:
                        payloads = parser.feed_bytes(data)
                    except EventTooLarge as exc:
                        exchange.fail(FailureKind.MALFORMED, str(exc))
                        return False
                    arrival = time.perf_counter_ns()
                    for payload in payloads:
                        if is_done(payload):
                            finished = True
                        elif (failure := take(payload, arrival)) is not None:
                            exchange.failure = failure
                            return False
            break
        except asyncio.TimeoutError:
            if not timeout.expired() or last == armed_from or exchange.waiting == _WHOLE:
                raise  # not this deadline's; or no byte since it was armed; or the whole request's passed
    for payload in parser.close_bytes():
        if is_done(payload):
            finished = True
        elif (failure := take(payload, time.perf_counter_ns())) is not None:
            exchange.failure = failure
            return False
    if not finished:
        exchange.fail(FailureKind.INCOMPLETE, "the stream ended before [DONE]")
        return False
    if (failure := exchange.reader.finish()) is not None:
        exchange.failure = failure
        return False
    exchange.done_ns = time.perf_counter_ns()
    return True
