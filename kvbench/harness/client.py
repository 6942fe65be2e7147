"""One streamed request to an OpenAI-compatible server, timed token by token.

`/v1/completions` carries token-id prompts (exact prefix structure); `/v1/chat/completions` carries text.
Both stream with `stream_options.include_usage`, so token counts come from the server's `usage`. Every
failure mode (HTTP error, malformed SSE, stall, timeout, lost connection) becomes an error on the record,
never an exception out of here and never a hang.

A request is watched in three phases, each with its own limit, inside `request_timeout_s` for the whole:

    sent ──header_timeout_s──> headers ──first_byte_timeout_s──> first byte ──stall_timeout_s──> ... [DONE]
                                                                  (and between every two reads after it)

OpenAI-compatible servers (vLLM, SGLang, ours) send headers before they schedule the prompt, so a server that
sends none is hung; the first byte waits for queueing and prefill, which is why its limit is the long one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from kvbench.measure.records import RequestRecord
from kvbench.harness.sse import SSEParser

API_COMPLETIONS = "completions"
API_CHAT = "chat"
APIS = (API_COMPLETIONS, API_CHAT)

# Error kinds (the part before ':' in RequestRecord.error); metrics count them by kind.
ERR_HTTP = "http"
ERR_CONNECTION = "connection"
ERR_TIMEOUT = "timeout"
ERR_STALL = "stalled"
ERR_MALFORMED = "malformed_sse"
ERR_INCOMPLETE = "incomplete_stream"
ERR_SERVER = "server_error"


@dataclass(frozen=True)
class EndpointConfig:
    """Where and how to send. `extra_body` is merged into every request body (engine-specific fields).

    `request_timeout_s` bounds a whole request; `header_timeout_s` the wait for response headers,
    `first_byte_timeout_s` the silence from the headers to the first body byte, and `stall_timeout_s` the silence
    between two reads after that.
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

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api: unknown value {self.api!r}; use one of {', '.join(APIS)}")

    @property
    def url(self) -> str:
        path = "/v1/completions" if self.api == API_COMPLETIONS else "/v1/chat/completions"
        return self.base_url.rstrip("/") + path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(slots=True)
class StreamResult:
    """What the stream said about the answer, for building the next turn."""

    text: str = ""
    token_ids: list[int] | None = None


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


async def stream_request(
    session: aiohttp.ClientSession, config: EndpointConfig, body: dict, record: RequestRecord
) -> StreamResult:
    """Send `body`, stream the answer, and fill `record`'s timestamps, counts and error in place."""
    result = StreamResult()
    try:
        await asyncio.wait_for(_stream(session, config, body, record, result), timeout=config.request_timeout_s)
    except asyncio.TimeoutError:
        if record.error is None:
            record.error = f"{ERR_TIMEOUT}: no complete answer within {config.request_timeout_s:g} s"
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError, OSError) as exc:
        record.error = f"{ERR_CONNECTION}: {type(exc).__name__}: {exc}"
    if record.error is None and record.done_ns is None:
        record.done_ns = time.perf_counter_ns()
    return result


async def _stream(
    session: aiohttp.ClientSession,
    config: EndpointConfig,
    body: dict,
    record: RequestRecord,
    result: StreamResult,
) -> None:
    record.sent_ns = time.perf_counter_ns()
    try:
        response = await asyncio.wait_for(
            session.post(config.url, json=body, headers=config.headers()), timeout=config.header_timeout_s
        )
    except asyncio.TimeoutError:
        record.error = f"{ERR_TIMEOUT}: no response headers within {config.header_timeout_s:g} s"
        return
    async with response:
        record.http_status = response.status
        if response.status >= 400:
            record.error = f"{ERR_HTTP}: {response.status} {_error_message(await response.text())}"
            record.done_ns = time.perf_counter_ns()
            return
        await _read_events(response, config, record, result)


async def _read_events(
    response: aiohttp.ClientResponse, config: EndpointConfig, record: RequestRecord, result: StreamResult
) -> None:
    """Parse the SSE body into `record` and `result`; the first read waits `first_byte_timeout_s`, later ones
    `stall_timeout_s`."""
    parser = SSEParser()
    finished = False
    chunks = response.content.iter_any()
    first = True
    while True:
        timeout = config.first_byte_timeout_s if first else config.stall_timeout_s
        try:
            data = await asyncio.wait_for(chunks.__anext__(), timeout=timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            if first:
                record.error = f"{ERR_TIMEOUT}: no first byte within {timeout:g} s of the response headers"
            else:
                record.error = f"{ERR_STALL}: no bytes for {timeout:g} s"
            return
        first = False
        arrival = time.perf_counter_ns()
        for payload in parser.feed(data):
            if payload.strip() == "[DONE]":
                finished = True
            elif not _consume(payload, arrival, record, result, config.api):
                return
    for payload in parser.close():
        if payload.strip() == "[DONE]":
            finished = True
        elif not _consume(payload, time.perf_counter_ns(), record, result, config.api):
            return
    if not finished:
        record.error = f"{ERR_INCOMPLETE}: the stream ended before [DONE]"
        return
    record.done_ns = time.perf_counter_ns()


def _error_message(text: str) -> str:
    """An error body's `error.message` (OpenAI's shape) when it has one, else its first 300 characters."""
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return str(message)[:300] if message else text[:300]


def _consume(payload: str, arrival_ns: int, record: RequestRecord, result: StreamResult, api: str) -> bool:
    """Apply one SSE payload to the record; False (with record.error set) when the stream is unusable."""
    try:
        event = json.loads(payload)
        if not isinstance(event, dict):
            raise ValueError("event is not a JSON object")
    except ValueError as exc:
        record.error = f"{ERR_MALFORMED}: {exc}: {payload[:120]!r}"
        return False
    if "error" in event and not event.get("choices"):
        record.error = f"{ERR_SERVER}: {json.dumps(event['error'])[:300]}"
        return False
    usage = event.get("usage")
    if usage:
        _apply_usage(usage, record)
    for choice in event.get("choices") or []:
        if api == API_COMPLETIONS:
            text = choice.get("text") or ""
        else:
            text = (choice.get("delta") or {}).get("content") or ""
        token_ids = choice.get("token_ids")
        if token_ids:
            if result.token_ids is None:
                result.token_ids = []
            result.token_ids.extend(int(token) for token in token_ids)
            tokens = len(token_ids)
        elif text:
            tokens = _logprob_token_count(choice) or 1
        else:
            tokens = 0
        result.text += text
        if tokens:
            if record.first_token_ns is None:
                record.first_token_ns = arrival_ns
            if record.chunks and record.chunks[-1][0] == arrival_ns:
                record.chunks[-1][1] += tokens  # several events in one network read are one chunk
            else:
                record.chunks.append([arrival_ns, tokens])
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    return True


def _logprob_token_count(choice: dict) -> int:
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        if isinstance(logprobs.get("tokens"), list):
            return len(logprobs["tokens"])
        if isinstance(logprobs.get("content"), list):
            return len(logprobs["content"])
    return 0


def _apply_usage(usage: dict, record: RequestRecord) -> None:
    if usage.get("prompt_tokens") is not None:
        record.prompt_tokens = int(usage["prompt_tokens"])
    if usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        record.cached_tokens = int(details["cached_tokens"])
    by_tier = details.get("cached_tokens_by_tier")
    if isinstance(by_tier, dict):
        record.cached_tokens_by_tier = {str(tier): int(count) for tier, count in by_tier.items()}
