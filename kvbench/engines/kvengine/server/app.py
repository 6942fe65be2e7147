"""The OpenAI-compatible HTTP server of our engine (aiohttp).

Routes: POST /v1/completions, POST /v1/chat/completions (streaming or not), GET /v1/models, GET /health
(alive), GET /ready (503 while a tokenizer lane is saturated or every sequence slot is held), GET /metrics (Prometheus), POST
/reset_prefix_cache. Model compute runs on the engine's own thread (`AsyncEngine`), tokenisation in the
server's two tokenizer lanes (`tokenizer_lanes`: small requests never wait behind large ones, a full lane is a
429); handlers only parse, stream and format, so the event loop (and /health) keeps answering whatever a
request carries. Every error is a JSON error in the OpenAI shape (`errors`).

Identity: with a tenants file, the Bearer key names the tenant (an unknown or missing key gets 401), and a
request that names a different tenant (body `tenant`, or header `X-Tenant`) gets 403: a key cannot claim
another tenant's identity. With a single `api_key` (or none) every request is tenant `default`.

Administration: /reset_prefix_cache (every tenant's cache) and /metrics (every tenant's name and counts)
need the admin key (`admin_key`, else `api_key`) as soon as any key is configured: no key or an unknown
one gets 401, a tenant's key 403. `metrics_open` opens /metrics to anyone (a Prometheus without a key).
/health is always open; /v1/models needs a key wherever the completions do. Keys are compared in constant
time (`hmac.compare_digest`).

Limits: a body beyond `protocol.max_body_bytes` of the model's context gets 413, a body nested deeper than
`admission.MAX_JSON_DEPTH` or holding more than `admission.MAX_JSON_CONTAINERS` objects 400 before it is
parsed, a text prompt beyond `protocol.max_prompt_chars` (for a chat: its templated length bound, or more
than `admission.MAX_MESSAGES` messages) 400 before it is tokenised. Clients that leave, or stop reading a
stream: `streaming`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from kvbench.engines.kvengine.runtime.async_engine import AsyncEngine
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.server.admission import TemplateCost, admitted_json, check_messages, check_prompt
from kvbench.engines.kvengine.server.answer import Answer
from kvbench.engines.kvengine.server.errors import SERVER_METRICS, error_response, openai_errors
from kvbench.engines.kvengine.server.protocol import (
    ParsedRequest,
    RequestError,
    max_body_bytes,
    max_prompt_chars,
    parse_chat,
    parse_completion,
)
from kvbench.engines.kvengine.server.server_metrics import ServerMetrics
from kvbench.engines.kvengine.server.streaming import serve
from kvbench.engines.kvengine.server.tokenizer_lanes import LaneFull, LaneLimits, TokenizerLanes, chars_per_token
from kvbench.engines.kvengine.settings.config import ServeOptions
from kvbench.settings import shown

SHAPE_INLINE_BYTES = 1 << 16  # bodies up to this size have their JSON shape checked on the event loop


@dataclass(frozen=True)
class Keys:
    """The keys a server accepts. No key at all: everything is open (a local, single-user server)."""

    api_key: str | None = None  # the key of tenant `default` (with or without a tenants file)
    admin_key: str | None = None  # administration; None: `api_key` administers
    metrics_open: bool = False  # /metrics needs no key

    @property
    def admin(self) -> str | None:
        return self.admin_key if self.admin_key is not None else self.api_key


@dataclass(frozen=True)
class Caller:
    """Who sent a request, from its Bearer key alone."""

    tenant: str | None  # None: no inference identity (no key, or an unknown one, where keys are needed)
    admin: bool
    known: bool  # its key is one this server knows (a tenant's, the api key or the admin key)


ASYNC_ENGINE = web.AppKey("async_engine", AsyncEngine)
KEYS = web.AppKey("keys", Keys)
LANES = web.AppKey("lanes", TokenizerLanes)
TEMPLATE = web.AppKey("template", TemplateCost)
STALL_TIMEOUT_S = web.AppKey("stall_timeout_s", float)


def make_app(
    async_engine: AsyncEngine,
    api_key: str | None = None,
    admin_key: str | None = None,
    metrics_open: bool = False,
    lane_limits: LaneLimits = LaneLimits(),
    stall_timeout_s: float = ServeOptions.stall_timeout_s,
) -> web.Application:
    engine = async_engine.engine
    app = web.Application(client_max_size=max_body_bytes(engine.max_model_len), middlewares=[openai_errors])
    app[ASYNC_ENGINE] = async_engine
    app[KEYS] = Keys(api_key, admin_key, metrics_open)
    app[SERVER_METRICS] = ServerMetrics(engine.metrics.registry, engine.model_name)
    app[LANES] = TokenizerLanes(
        max_prompt_chars(engine.max_model_len),
        app[SERVER_METRICS],
        lane_limits,
        chars_per_token(engine.loaded.tokenizer),
    )
    app[TEMPLATE] = TemplateCost.measure(engine.loaded.tokenizer)
    app[STALL_TIMEOUT_S] = stall_timeout_s
    app.on_cleanup.append(_stop_tokenizer)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    return app


def _engine(request: web.Request) -> Engine:
    """The step loop behind the app's AsyncEngine, for what it knows (model name, limits, tokenizer, tenants,
    metrics); whatever changes its state goes through the AsyncEngine, on the engine's thread."""
    return request.app[ASYNC_ENGINE].engine


async def _stop_tokenizer(app: web.Application) -> None:
    app[LANES].close()


async def _body(request: web.Request) -> Mapping:
    too_large = RequestError(
        f"the body is larger than this server accepts ({request.client_max_size} bytes for "
        "its model's context); shorten the prompt",
        status=413,
    )
    if (request.content_length or 0) > request.client_max_size:
        raise too_large  # refused before a byte of it is read
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    if len(raw) > SHAPE_INLINE_BYTES:  # numpy releases the GIL: the loop answers others meanwhile
        raw = await asyncio.get_running_loop().run_in_executor(None, admitted_json, raw)
    else:
        raw = admitted_json(raw)  # before json.loads recurses into it, or builds 100,000 objects
    try:
        body = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise RequestError(f"the body is not valid JSON ({str(exc).splitlines()[0][:100]})") from None
    if not isinstance(body, Mapping):
        raise RequestError("the body must be a JSON object")
    return body


def _same(a: str, b: str) -> bool:
    """Constant-time comparison of two keys (any characters)."""
    return hmac.compare_digest(a.encode("utf-8", "surrogateescape"), b.encode("utf-8", "surrogateescape"))


def _caller(request: web.Request) -> Caller:
    keys = request.app[KEYS]
    tenants = _engine(request).tenants
    header = request.headers.get("Authorization", "")
    key = header[len("Bearer ") :] if header.startswith("Bearer ") else None
    keyed = bool(tenants.tenants or keys.api_key)  # inference needs a key
    if not keyed and keys.admin_key is None:
        return Caller("default", admin=True, known=True)  # no key at all: a local, single-user server
    if key is None:
        return Caller(None if keyed else "default", admin=False, known=False)
    admin = keys.admin is not None and _same(key, keys.admin)
    tenant = tenants.tenant_for(key) if tenants.tenants else None
    if tenant is not None:
        return Caller(tenant, admin, known=True)
    is_api_key = keys.api_key is not None and _same(key, keys.api_key)
    return Caller("default" if admin or is_api_key or not keyed else None, admin, known=admin or is_api_key)


def _tenant(request: web.Request, body: Mapping | None = None) -> str:
    tenant = _caller(request).tenant
    if tenant is None:
        raise RequestError(
            "invalid or missing API key (Authorization: Bearer ...)", status=401, kind="authentication_error"
        )
    claimed = [c for c in (request.headers.get("X-Tenant"), (body or {}).get("tenant")) if c is not None]
    if any(c != tenant for c in claimed):
        raise RequestError(
            "tenant: a request cannot claim another tenant's identity; the API key decides the tenant",
            "tenant",
            status=403,
            kind="permission_error",
        )
    return tenant


def _require_admin(request: web.Request, what: str) -> None:
    caller = _caller(request)
    if caller.admin:
        return
    if caller.known:
        raise RequestError(
            f"{what} needs the admin key; a tenant's key cannot act on every tenant's cache",
            status=403,
            kind="permission_error",
        )
    raise RequestError(
        f"{what} needs the admin key (Authorization: Bearer ...)", status=401, kind="authentication_error"
    )


def _check_model(request: web.Request, body: Mapping) -> None:
    engine = _engine(request)
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise RequestError(f"model: must be a string, got {shown(name)}", "model")
    if name is not None and name not in (engine.model_name, "default"):
        raise RequestError(
            f"model {shown(name)} is not served here; use {engine.model_name!r}",
            "model",
            status=404,
            kind="not_found_error",
        )


async def completions(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    limit = max_prompt_chars(engine.max_model_len)
    return await _handle(
        request,
        lambda body, tenant: parse_completion(body, engine.loaded.tokenizer, tenant, limit),
        lambda body: check_prompt(body, limit),
        chat=False,
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    limit = max_prompt_chars(engine.max_model_len)
    template = request.app[TEMPLATE]
    return await _handle(
        request,
        lambda body, tenant: parse_chat(body, engine.loaded.chat_prompt_ids, tenant, limit),
        lambda body: check_messages(body, template, limit),
        chat=True,
    )


async def _handle(request: web.Request, parse, cost, chat: bool) -> web.StreamResponse:
    """Authenticate, bound, parse and validate (each failure an OpenAI-style error), then serve the generation.
    `cost(body)`: the characters parsing will tokenise, checked on the event loop (RequestError beyond what
    the context holds); parsing then runs in that cost's tokenizer lane. This is where a request is checked
    against the engine's limits, once: the engine trusts what it is given."""
    _tenant(request)  # 401 before reading the body
    body = await _body(request)
    tenant = _tenant(request, body)
    _check_model(request, body)
    try:
        parsed = await request.app[LANES].run(cost(body), parse, body, tenant)
        _engine(request).limits.check(parsed.generation)
    except LaneFull as exc:
        return error_response(str(exc), 429, headers={"Retry-After": str(exc.retry_after_s)})
    except RequestError:
        raise
    except ValueError as exc:
        return error_response(str(exc))
    return await _serve(request, parsed, chat=chat)


async def _serve(request: web.Request, parsed: ParsedRequest, chat: bool) -> web.StreamResponse:
    engine, app = _engine(request), request.app
    answer = Answer(parsed, engine.loaded.tokenizer, engine.model_name, chat)
    return await serve(request, app[ASYNC_ENGINE], answer, app[STALL_TIMEOUT_S], app[SERVER_METRICS])


async def models(request: web.Request) -> web.Response:
    _tenant(request)
    engine = _engine(request)
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": engine.model_name,
                    "object": "model",
                    "owned_by": "kvbench",
                    "max_model_len": engine.max_model_len,
                }
            ],
        }
    )


async def health(request: web.Request) -> web.Response:
    failure = request.app[ASYNC_ENGINE].failure
    if failure is not None:
        return web.Response(status=503, text=f"engine failed: {failure}")
    return web.Response(text="ok")


async def ready(request: web.Request) -> web.Response:
    """Ready for more work: 200, or 503 while the engine failed, a tokenizer lane would refuse its largest
    request, or every sequence slot (`max_num_seqs`) is held (a new request would wait for one; 16 streams
    whose clients never read held them all while /ready said "ready"). /health stays 200 while alive."""
    lanes, engine = request.app[LANES], _engine(request)
    running, slots = engine.scheduler.num_running, engine.config.max_num_seqs  # ints read across threads
    failure, saturated = request.app[ASYNC_ENGINE].failure, lanes.saturated()
    busy = saturated or running >= slots
    status = "failed" if failure is not None else "saturated" if busy else "ready"
    return web.json_response(
        {
            "status": status,
            "saturated_lanes": saturated,
            "queue_depth": lanes.depths(),
            "running": running,
            "max_num_seqs": slots,
        },
        status=200 if status == "ready" else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    if not request.app[KEYS].metrics_open:
        _require_admin(request, "/metrics")
    return web.Response(body=_engine(request).metrics.exposition(), content_type="text/plain", charset="utf-8")


async def reset_prefix_cache(request: web.Request) -> web.Response:
    _require_admin(request, "/reset_prefix_cache")
    freed = await request.app[ASYNC_ENGINE].call(lambda engine: engine.reset_prefix_cache())
    return web.json_response({"status": "ok", "freed_pages": freed})
