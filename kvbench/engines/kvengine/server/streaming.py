"""Sending a generation to its client: a stream of server-sent events, or one JSON body at the end.

A non-streaming client that leaves is noticed within `DISCONNECT_POLL_S` and its request aborted (its pages
freed), as a streaming one is at its next write. A streaming client that stops reading (its socket full,
`PARK_BACKLOG_BYTES` waiting) has its request parked at once (no batch slot, no device page; counted in
`kvbench:num_requests_parked`, see `core/parking.py`) and resumed when it reads again; one that reads nothing
for `stall_timeout_s` is ended: its request aborted, counted in `kvbench:client_stalled_total`. Before, 16
such clients held every slot until the stall timeout (a normal request waited 6.6 s), and before that to
max_tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass

from aiohttp import web

from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
from kvbench.engines.kvengine.runtime.requests import StepOutput
from kvbench.engines.kvengine.server.answer import Answer
from kvbench.engines.kvengine.server.errors import error_response
from kvbench.engines.kvengine.server.server_metrics import ServerMetrics

DISCONNECT_POLL_S = 0.25  # how often a non-streaming handler checks that its client is still there
# A streaming answer's socket send buffer: small, so that a client that stops reading backs our writes up
# within kilobytes (Linux grows the buffer to megabytes otherwise) and its request is parked early.
STREAM_SEND_BUFFER_BYTES = 1 << 12
PARK_BACKLOG_BYTES = 1 << 12  # unsent bytes (past the socket's buffers) that park a stream's request
BACKLOG_POLL_S = 0.02  # how often a parked stream looks whether its backlog was sent


async def serve(
    request: web.Request, async_engine: AsyncEngine, answer: Answer, stall_timeout_s: float, metrics: ServerMetrics
) -> web.StreamResponse:
    """Generate `answer`'s request and send it: as server-sent events if it streams, else as one JSON body."""
    parsed = answer.parsed
    if not parsed.stream:
        return await _serve_whole(request, async_engine, answer)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    _small_send_buffer(request)
    await response.prepare(request)
    try:
        await _stream(
            async_engine,
            answer,
            _Writer(request, response, async_engine, parsed.generation.request_id, stall_timeout_s),
        )
    except TimeoutError:  # the client stopped reading; aclosing has aborted its request (slot and pages freed)
        metrics.client_stalled()
        request.transport.close()
        return response
    await response.write_eof()
    return response


async def _stream(async_engine: AsyncEngine, answer: Answer, write: _Writer) -> None:
    parsed, first = answer.parsed, True
    # aclosing: when a write fails (the client left, or stopped reading), the request is aborted now, not
    # when the generator is garbage-collected.
    try:
        async with contextlib.aclosing(async_engine.generate(parsed.generation)) as outputs:
            async for output in outputs:
                logprobs_before, ids_before = len(answer.logprobs), len(answer.token_ids)
                delta = answer.add(output)
                new_ids = answer.token_ids[ids_before:]
                if new_ids or (first and parsed.echo):
                    await write(_event(answer.chunk(delta, answer.logprobs[logprobs_before:], new_ids, first)))
                    first = False
                _stop_if_stopped(async_engine, answer, output)
        await write(_event(answer.final_chunk()))
        if parsed.include_usage:
            await write(_event(answer.usage_chunk()))
    except RuntimeError as exc:
        await write(_event({"error": {"message": str(exc), "type": "server_error", "code": 500}}))
    await write(b"data: [DONE]\n\n")


async def _serve_whole(request: web.Request, async_engine: AsyncEngine, answer: Answer) -> web.StreamResponse:
    """A non-streaming answer. Nothing is written before the end, so a client that leaves would go unnoticed
    until max_tokens: the connection is checked every DISCONNECT_POLL_S, and the request aborted if gone."""

    async def collect() -> None:
        async with contextlib.aclosing(async_engine.generate(answer.parsed.generation)) as outputs:
            async for output in outputs:
                answer.add(output)
                _stop_if_stopped(async_engine, answer, output)

    task = asyncio.ensure_future(collect())
    try:
        while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_S))[0]:
            if request.transport is None or request.transport.is_closing():
                task.cancel()  # generate() aborts the request on its way out
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ConnectionResetError("the client left")  # counted by the error middleware
        task.result()  # what collect() raised, if anything
    except RuntimeError as exc:
        return error_response(str(exc), 500, "server_error")
    finally:
        task.cancel()  # a no-op once done; otherwise this handler was cancelled, and the request goes too
    return web.json_response(answer.body())


def _small_send_buffer(request: web.Request) -> None:
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER_BYTES)


@dataclass(frozen=True)
class _Writer:
    """A stream's writes. Once more than `PARK_BACKLOG_BYTES` wait unsent (the client reads slower than we
    write), its request is parked (no batch slot, no device page; `core/parking.py`) until they are sent; a
    backlog that `stall_timeout_s` does not clear ends the stream (TimeoutError)."""

    request: web.Request
    response: web.StreamResponse
    async_engine: AsyncEngine
    request_id: str
    stall_timeout_s: float

    async def __call__(self, data: bytes) -> None:
        async with asyncio.timeout(self.stall_timeout_s):
            await self.response.write(data)
            if self._backlog() <= PARK_BACKLOG_BYTES:
                return
            self.async_engine.park(self.request_id)
            while self._backlog() > 0:  # past the timeout, the abort that follows ends it where it is parked
                await asyncio.sleep(BACKLOG_POLL_S)
            self.async_engine.resume(self.request_id)

    def _backlog(self) -> int:
        transport = self.request.transport
        return 0 if transport is None else transport.get_write_buffer_size()


def _stop_if_stopped(async_engine: AsyncEngine, answer: Answer, output: StepOutput) -> None:
    """A stop string ended the text: end the request in the engine too."""
    if answer.text.stopped and not output.finished:
        async_engine.abort(answer.parsed.generation.request_id, "stop")


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
