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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from kvbench.harness.sse import DEFAULT_MAX_EVENT_BYTES, EventTooLarge, SSEParser
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


@dataclass(slots=True)
class _Exchange:
    """One request's progress on the wire, beside what `AnswerReader` read of its body."""

    reader: AnswerReader
    sent_ns: int | None = None
    http_status: int | None = None
    done_ns: int | None = None
    failure: Failure | None = None

    def fail(self, kind: FailureKind, reason: str) -> None:
        self.failure = Failure(kind, reason)


async def stream_request(session: aiohttp.ClientSession, config: EndpointConfig, body: dict) -> Answer:
    """Send `body`, stream the answer, and return it: timestamps, counts, chunks, and its failure or none.

    The answer is read through `AnswerReader` with `body`'s max_tokens as its bound: whatever the server sends,
    the request ends with an answer, complete or failed for one named reason, never with an exception."""
    max_tokens = body.get("max_tokens")
    limits = AnswerLimits(max_tokens if isinstance(max_tokens, int) else None, config.max_context_tokens)
    exchange = _Exchange(AnswerReader(config.api, limits))
    try:
        await asyncio.wait_for(_stream(session, config, body, exchange), timeout=config.request_timeout_s)
    except asyncio.TimeoutError:
        if exchange.failure is None:
            exchange.fail(FailureKind.TIMEOUT, f"no complete answer within {config.request_timeout_s:g} s")
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        exchange.fail(FailureKind.CONNECTION, f"{type(exc).__name__}: {exc}")
    if exchange.failure is None and exchange.done_ns is None:
        exchange.done_ns = time.perf_counter_ns()
    return exchange.reader.answer(exchange.sent_ns, exchange.http_status, exchange.done_ns, exchange.failure)


async def _stream(session: aiohttp.ClientSession, config: EndpointConfig, body: dict, exchange: _Exchange) -> None:
    exchange.sent_ns = time.perf_counter_ns()
    try:
        response = await asyncio.wait_for(
            session.post(config.url, json=body, headers=config.headers()), timeout=config.header_timeout_s
        )
    except asyncio.TimeoutError:
        exchange.fail(FailureKind.TIMEOUT, f"no response headers within {config.header_timeout_s:g} s")
        return
    async with response:
        exchange.http_status = response.status
        if response.status >= 400:
            text = (await response.content.read(_ERROR_BODY_BYTES)).decode("utf-8", errors="replace")
            exchange.fail(FailureKind.HTTP, f"{response.status} {error_message(text)}")
            exchange.done_ns = time.perf_counter_ns()
            return
        if not await _read_events(response, config, exchange):
            response.close()  # stop the answer now: the rest of it is not read (nor waited for)


async def _read_events(response: aiohttp.ClientResponse, config: EndpointConfig, exchange: _Exchange) -> bool:
    """Parse the SSE body into `exchange.reader`; the first read waits `first_byte_timeout_s`, later ones
    `stall_timeout_s`. False (with `exchange.failure` set) when the request failed before the stream's end."""
    parser = SSEParser(config.max_event_bytes)
    reader = exchange.reader
    finished = False
    chunks = response.content.iter_any()
    first = True
    # The whole request's deadline is kept here too, not only by the wait_for around the request: on Python
    # 3.11 a wait_for whose read completes as it is cancelled swallows the cancellation (fixed in 3.12), and
    # a server that streams without pause then held a request far past request_timeout_s.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.request_timeout_s - (time.perf_counter_ns() - exchange.sent_ns) / 1e9
    while True:
        phase = config.first_byte_timeout_s if first else config.stall_timeout_s
        left = deadline - loop.time()
        if left <= 0:
            exchange.fail(FailureKind.TIMEOUT, f"no complete answer within {config.request_timeout_s:g} s")
            return False
        timeout = min(phase, left)
        try:
            data = await asyncio.wait_for(chunks.__anext__(), timeout=timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            if timeout < phase:
                exchange.fail(FailureKind.TIMEOUT, f"no complete answer within {config.request_timeout_s:g} s")
            elif first:
                exchange.fail(FailureKind.TIMEOUT, f"no first byte within {timeout:g} s of the response headers")
            else:
                exchange.fail(FailureKind.STALLED, f"no bytes for {timeout:g} s")
            return False
        first = False
        try:
            payloads = parser.feed(data)
        except EventTooLarge as exc:
            exchange.fail(FailureKind.MALFORMED, str(exc))
            return False
        arrival = time.perf_counter_ns()
        for payload in payloads:
            if payload.strip() == "[DONE]":
                finished = True
            elif (failure := reader.take(payload, arrival)) is not None:
                exchange.failure = failure
                return False
    for payload in parser.close():
        if payload.strip() == "[DONE]":
            finished = True
        elif (failure := reader.take(payload, time.perf_counter_ns())) is not None:
            exchange.failure = failure
            return False
    if not finished:
        exchange.fail(FailureKind.INCOMPLETE, "the stream ended before [DONE]")
        return False
    if (failure := reader.finish()) is not None:
        exchange.failure = failure
        return False
    exchange.done_ns = time.perf_counter_ns()
    return True
