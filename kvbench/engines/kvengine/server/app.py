"""The OpenAI-compatible HTTP server of our engine (aiohttp).

Routes: POST /v1/completions, POST /v1/chat/completions (streaming or not), GET /v1/models, GET /health,
GET /metrics (Prometheus), POST /reset_prefix_cache. Model compute runs on the engine's own thread
(`AsyncEngine`); handlers only parse, stream and format.

Identity: with a tenants file, the Bearer key names the tenant (an unknown or missing key gets 401), and a
request that names a different tenant (body `tenant`, or header `X-Tenant`) gets 403: a key cannot claim
another tenant's identity. With a single `api_key` (or none) every request is tenant `default`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping

from aiohttp import web

from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
from kvbench.engines.kvengine.runtime.requests import StepOutput, TokenLogprob
from kvbench.engines.kvengine.server.protocol import ParsedRequest, RequestError, parse_chat, parse_completion
from kvbench.engines.kvengine.server.text import TextStream

ENGINE_KEY = web.AppKey("engine", AsyncEngine)
API_KEY = web.AppKey("api_key", object)


def make_app(engine: AsyncEngine, api_key: str | None = None) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = engine
    app[API_KEY] = api_key
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    return app


def error_response(message: str, status: int = 400, kind: str = "invalid_request_error", param: str | None = None):
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}}, status=status)


async def _body(request: web.Request) -> Mapping:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError("the body is not valid JSON") from None
    if not isinstance(body, Mapping):
        raise RequestError("the body must be a JSON object")
    return body


def _tenant(request: web.Request, body: Mapping | None = None) -> str:
    expected = request.app[API_KEY]
    tenants = request.app[ENGINE_KEY].engine.tenants
    header = request.headers.get("Authorization", "")
    key = header[len("Bearer "):] if header.startswith("Bearer ") else None
    if tenants.tenants:
        tenant = tenants.tenant_for(key) if key else None
        if tenant is None and (expected is None or key != expected):
            raise RequestError("invalid or missing API key (Authorization: Bearer ...)", status=401,
                               kind="authentication_error")
        tenant = tenant or "default"
    else:
        if expected is not None and key != expected:
            raise RequestError("invalid or missing API key (Authorization: Bearer ...)", status=401,
                               kind="authentication_error")
        tenant = "default"
    claimed = [c for c in (request.headers.get("X-Tenant"), (body or {}).get("tenant")) if c is not None]
    if any(c != tenant for c in claimed):
        raise RequestError("tenant: a request cannot claim another tenant's identity; the API key decides the tenant",
                           "tenant", status=403, kind="permission_error")
    return tenant


def _check_model(request: web.Request, body: Mapping) -> None:
    engine = request.app[ENGINE_KEY].engine
    name = body.get("model")
    if name is not None and name not in (engine.model_name, "default"):
        raise RequestError(
            f"model {name!r} is not served here; use {engine.model_name!r}", "model", status=404, kind="not_found_error"
        )


async def completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY].engine
    return await _handle(request, lambda body, tenant: parse_completion(body, engine.loaded.tokenizer, tenant), chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY].engine
    return await _handle(request, lambda body, tenant: parse_chat(body, engine.loaded.chat_prompt_ids, tenant), chat=True)


async def _handle(request: web.Request, parse, chat: bool) -> web.StreamResponse:
    """Authenticate, parse and validate (each failure an OpenAI-style error), then serve the generation."""
    engine = request.app[ENGINE_KEY]
    try:
        _tenant(request)  # 401 before reading the body
        body = await _body(request)
        tenant = _tenant(request, body)
        _check_model(request, body)
        parsed = parse(body, tenant)
        engine.engine.validate(parsed.generation)
    except RequestError as exc:
        return error_response(str(exc), exc.status, exc.kind, exc.param)
    except ValueError as exc:
        return error_response(str(exc))
    return await _serve(request, engine, parsed, chat=chat)


class _Answer:
    """Accumulates one request's answer from engine outputs; formats chunks and the final body."""

    def __init__(self, parsed: ParsedRequest, tokenizer, model: str, chat: bool) -> None:
        self.parsed = parsed
        self.tokenizer = tokenizer
        self.model = model
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.text = TextStream(tokenizer, parsed.stop)
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: tuple[TokenLogprob, ...] | None = None
        self.finish_reason: str | None = None
        self.prompt_tokens = len(parsed.generation.prompt_ids)
        self.cached_tokens = 0
        self.cached_by_tier: dict[str, int] | None = None

    def add(self, output: StepOutput) -> str:
        """Apply an engine output; returns the text delta (empty when none)."""
        self.cached_tokens = output.cached_tokens
        if output.cached_tokens_by_tier is not None:
            self.cached_by_tier = output.cached_tokens_by_tier
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        if output.finish_reason is not None:
            self.finish_reason = "stop" if output.finish_reason == "stop" else output.finish_reason
        if output.token_id is None or self.parsed.drop_generated:
            return ""
        self.token_ids.append(output.token_id)
        if output.logprob is not None:
            self.logprobs.append(output.logprob)
        return self.text.add(output.token_id)

    def usage(self) -> dict:
        completion = len(self.token_ids)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens,
                                      "cached_tokens_by_tier": dict(self.cached_by_tier or {})},
        }

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def completion_logprobs(self, entries: list[TokenLogprob], with_prompt: bool) -> dict:
        tokens, values, tops = [], [], []
        if with_prompt:
            prompt = self.parsed.generation.prompt_ids
            tokens.append(self._decode(prompt[0]))
            values.append(None)
            tops.append(None)
            for entry in self.prompt_logprobs or ():
                tokens.append(self._decode(entry.token_id))
                values.append(entry.logprob)
                tops.append(self._top(entry))
        for entry in entries:
            tokens.append(self._decode(entry.token_id))
            values.append(entry.logprob)
            tops.append(self._top(entry))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": _offsets(tokens)}

    def _top(self, entry: TokenLogprob) -> dict[str, float]:
        top: dict[str, float] = {}
        for token_id, value in entry.top:
            top.setdefault(self._decode(token_id), value)
        return top

    def chat_logprobs(self, entries: list[TokenLogprob]) -> dict:
        return {
            "content": [
                {
                    "token": self._decode(entry.token_id),
                    "logprob": entry.logprob,
                    "top_logprobs": [{"token": self._decode(t), "logprob": v} for t, v in entry.top],
                }
                for entry in entries
            ]
        }

    def chunk(self, delta: str, new_logprobs: list[TokenLogprob], new_ids: list[int], first: bool) -> dict:
        choice: dict = {"index": 0, "finish_reason": None}
        if self.chat:
            choice["delta"] = ({"role": "assistant"} if first else {}) | {"content": delta}
            choice["logprobs"] = self.chat_logprobs(new_logprobs) if self.parsed.logprobs is not None else None
        else:
            echo = self.parsed.echo and first
            text = (self.tokenizer.decode(list(self.parsed.generation.prompt_ids)) if echo else "") + delta
            choice["text"] = text
            choice["logprobs"] = (
                self.completion_logprobs(new_logprobs, with_prompt=echo) if self.parsed.logprobs is not None else None
            )
        if self.parsed.return_token_ids:
            choice["token_ids"] = new_ids
        return {"id": self.id, "object": self._object(True), "created": self.created, "model": self.model, "choices": [choice]}

    def final_chunk(self) -> dict:
        choice: dict = {"index": 0, "finish_reason": self.finish_reason}
        choice["delta" if self.chat else "text"] = {} if self.chat else ""
        return {"id": self.id, "object": self._object(True), "created": self.created, "model": self.model, "choices": [choice]}

    def usage_chunk(self) -> dict:
        return {"id": self.id, "object": self._object(True), "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage()}

    def body(self) -> dict:
        choice: dict = {"index": 0, "finish_reason": self.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": self.text.text}
            choice["logprobs"] = self.chat_logprobs(self.logprobs) if self.parsed.logprobs is not None else None
        else:
            prompt_text = self.tokenizer.decode(list(self.parsed.generation.prompt_ids)) if self.parsed.echo else ""
            choice["text"] = prompt_text + self.text.text
            choice["logprobs"] = (
                self.completion_logprobs(self.logprobs, with_prompt=self.parsed.echo)
                if self.parsed.logprobs is not None else None
            )
        if self.parsed.return_token_ids:
            choice["token_ids"] = self.token_ids
            choice["prompt_token_ids"] = list(self.parsed.generation.prompt_ids)
        return {"id": self.id, "object": self._object(False), "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage()}

    def _object(self, streaming: bool) -> str:
        if self.chat:
            return "chat.completion.chunk" if streaming else "chat.completion"
        return "text_completion"


def _offsets(tokens: list[str]) -> list[int]:
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return offsets


async def _serve(request: web.Request, engine: AsyncEngine, parsed: ParsedRequest, chat: bool) -> web.StreamResponse:
    answer = _Answer(parsed, engine.engine.loaded.tokenizer, engine.engine.model_name, chat)
    request_id = parsed.generation.request_id
    if not parsed.stream:
        try:
            async for output in engine.generate(parsed.generation):
                answer.add(output)
                if answer.text.stopped and not output.finished:
                    engine.abort(request_id, "stop")
        except RuntimeError as exc:
            return error_response(str(exc), 500, "server_error")
        return web.json_response(answer.body())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    first = True
    try:
        async for output in engine.generate(parsed.generation):
            logprobs_before, ids_before = len(answer.logprobs), len(answer.token_ids)
            delta = answer.add(output)
            new_ids = answer.token_ids[ids_before:]
            if new_ids or (first and parsed.echo):
                await response.write(_event(answer.chunk(delta, answer.logprobs[logprobs_before:], new_ids, first)))
                first = False
            if answer.text.stopped and not output.finished:
                engine.abort(request_id, "stop")
        await response.write(_event(answer.final_chunk()))
        if parsed.include_usage:
            await response.write(_event(answer.usage_chunk()))
    except RuntimeError as exc:
        await response.write(_event({"error": {"message": str(exc), "type": "server_error", "code": 500}}))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY].engine
    return web.json_response({
        "object": "list",
        "data": [{"id": engine.model_name, "object": "model", "owned_by": "kvbench", "max_model_len": engine.max_model_len}],
    })


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.failure is not None:
        return web.Response(status=503, text=f"engine failed: {engine.failure}")
    return web.Response(text="ok")


async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY].engine
    return web.Response(body=engine.metrics.exposition(), content_type="text/plain", charset="utf-8")


async def reset_prefix_cache(request: web.Request) -> web.Response:
    freed = await request.app[ENGINE_KEY].call(lambda engine: engine.reset_prefix_cache())
    return web.json_response({"status": "ok", "freed_pages": freed})
