"""A measurement instrument: an OpenAI-style streaming server whose timing and faults are injected and known.

It is not an engine. It exists to check the client: measured TTFT must equal the injected first-token delay,
measured ITL the injected gap, token counts the usage it reports, and every injected fault must become an
error record. It also serves as the target of `kvbench bench loadgen`.

Each request is answered with `max_tokens` tokens (or `output_share` of them, ending with finish_reason "stop";
ids `first_token_id + i`) in chunks of `tokens_per_chunk`,
the first chunk `first_token_ms` after the request arrived and one chunk every `chunk_interval_ms` after
that, all on an absolute schedule so that server-side jitter does not accumulate.

Misbehaviour is injected too, one kind per field of `InstrumentBehaviour`: `overrides` puts any JSON value at
any path of the events (`usage.prompt_tokens`, `choices.0.token_ids`, `choices`, `usage`, ...),
`ignore_max_tokens` streams without end, `first_event_bytes` pads the first event to a size; what was sent
is logged (`InstrumentLog.tokens_sent`), so a test knows what the client was given.

Server-wide, it can serve only one model name (others get a 404, as vLLM answers an unknown model) and a
/metrics body given as is (none: /metrics is a 404), e.g. a proxy's HTML page, to check how scraping copes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from aiohttp import web

from kvbench.harness.clock import PreciseTimer

FAULT_NONE = "none"
FAULT_HTTP_500 = "http_500"
FAULT_MALFORMED = "malformed"
FAULT_STALL = "stall"
FAULT_DROP = "drop"
FAULT_NO_HEADERS = "no_headers"
FAULTS = (FAULT_NONE, FAULT_HTTP_500, FAULT_MALFORMED, FAULT_STALL, FAULT_DROP, FAULT_NO_HEADERS)
USAGE_PATH = "usage"  # overrides under it apply to the usage event, all others to every token event


@dataclass(frozen=True)
class InstrumentBehaviour:
    """What the instrument does for one request.

    `cached_tokens` is reported as told (None: the field is left out of usage). `fault` applies after
    `fault_after_chunks` chunks (0: before the first). `stall` keeps the connection open and silent;
    `no_headers` does so before even the response headers (a hung server), whatever `fault_after_chunks` says.

    Misbehaviour: `overrides` maps a dotted path to the JSON value put there (a number is a list index, a
    missing step is created; `usage...` paths edit the usage event, others every token event, and the usage
    event is sent whenever a `usage...` path is given); `ignore_max_tokens` streams tokens until the client
    leaves; `first_event_bytes` pads the first token event (a `pad` field) to about that many bytes.
    """

    first_token_ms: float = 20.0
    chunk_interval_ms: float = 5.0
    tokens_per_chunk: int = 1
    cached_tokens: int | None = None
    return_token_ids: bool = True
    first_token_id: int = 1000
    fault: str = FAULT_NONE
    fault_after_chunks: int = 0
    overrides: Mapping[str, object] = field(default_factory=dict)
    ignore_max_tokens: bool = False
    first_event_bytes: int = 0
    output_share: float = 1.0  # answer round(max_tokens x this) tokens (at least 1), finish_reason "stop" if fewer

    def __post_init__(self) -> None:
        if not 0 < self.output_share <= 1:
            raise ValueError(
                f"output_share must be in (0, 1] (a server never sends past max_tokens), got {self.output_share}"
            )
        if self.fault not in FAULTS:
            raise ValueError(f"fault: unknown {self.fault!r}; use one of {', '.join(FAULTS)}")
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")


@dataclass(slots=True)
class InstrumentLog:
    """What the instrument saw: every request body, its arrival time (perf_counter_ns) and its key."""

    bodies: list[dict] = field(default_factory=list)
    arrivals_ns: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # the Authorization header of each request
    tokens_sent: list[int] = field(default_factory=list)  # per request, the tokens written (so far)


BehaviourFn = Callable[[int, dict], InstrumentBehaviour]
LOG_KEY = web.AppKey("log", InstrumentLog)


def make_app(
    behaviour: InstrumentBehaviour | BehaviourFn,
    log: InstrumentLog | None = None,
    served_model: str | None = None,
    metrics_body: str | None = None,
    max_model_len: int | None = None,
) -> web.Application:
    """An aiohttp app; `behaviour` is fixed, or a function of (request index, body) for per-request faults.

    `served_model`: the one model name answered (None: any); `metrics_body`: what GET /metrics returns
    (None: no /metrics route); `max_model_len`: the context window /v1/models states (None: none).
    """
    log = log if log is not None else InstrumentLog()
    timer = PreciseTimer()  # one spinner for every stream's chunk deadlines
    choose: BehaviourFn = behaviour if callable(behaviour) else (lambda index, body: behaviour)

    async def completions(request: web.Request) -> web.StreamResponse:
        arrival = time.perf_counter_ns()
        body = await request.json()
        index = len(log.bodies)
        log.bodies.append(body)
        log.arrivals_ns.append(arrival)
        log.keys.append(request.headers.get("Authorization", ""))
        if served_model is not None and body.get("model") != served_model:
            message = f"The model `{body.get('model')}` does not exist."  # vLLM's words
            return web.json_response({"error": {"message": message, "type": "NotFoundError", "code": 404}}, status=404)
        chat = request.path.endswith("chat/completions")
        return await _answer(request, body, choose(index, body), arrival, chat, timer)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=metrics_body, content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        model = {"id": served_model or "instrument", "object": "model"}
        if max_model_len is not None:
            model["max_model_len"] = max_model_len
        return web.json_response({"object": "list", "data": [model]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    if metrics_body is not None:
        app.router.add_get("/metrics", metrics)
    app[LOG_KEY] = log
    return app


async def _answer(
    request: web.Request, body: dict, behaviour: InstrumentBehaviour, arrival_ns: int, chat: bool, timer: PreciseTimer
) -> web.StreamResponse:
    if behaviour.fault == FAULT_HTTP_500 and behaviour.fault_after_chunks == 0:
        return web.json_response({"error": {"message": "injected failure", "type": "server_error"}}, status=500)
    if behaviour.fault == FAULT_NO_HEADERS:
        await asyncio.sleep(3600)
    asked = int(body.get("max_tokens") or 16)
    max_tokens = max(1, round(asked * behaviour.output_share))
    prompt = body.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(json.dumps(body.get("messages", prompt))) // 4
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    log = request.app[LOG_KEY]
    slot = len(log.tokens_sent)
    log.tokens_sent.append(0)
    token_overrides = {path: value for path, value in behaviour.overrides.items() if not _is_usage(path)}
    sent = 0
    chunk_index = 0
    while sent < max_tokens or behaviour.ignore_max_tokens:
        if chunk_index == behaviour.fault_after_chunks and behaviour.fault != FAULT_NONE:
            return await _fault(request, response, behaviour.fault)
        due = arrival_ns + int((behaviour.first_token_ms + chunk_index * behaviour.chunk_interval_ms) * 1e6)
        await timer.sleep_until(due)
        count = (
            behaviour.tokens_per_chunk
            if behaviour.ignore_max_tokens
            else min(behaviour.tokens_per_chunk, max_tokens - sent)
        )
        ids = list(range(behaviour.first_token_id + sent, behaviour.first_token_id + sent + count))
        text = "".join(f" t{token}" for token in ids)
        finished = "length" if max_tokens == asked else "stop"
        choice: dict = {"index": 0, "finish_reason": finished if sent + count >= max_tokens else None}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        if behaviour.return_token_ids and body.get("return_token_ids"):
            choice["token_ids"] = ids
        event: dict = {"object": "text_completion", "choices": [choice]}
        if chunk_index == 0 and behaviour.first_event_bytes:
            event["pad"] = "x" * behaviour.first_event_bytes
        try:
            await response.write(_event(overridden(event, token_overrides)))
        except ConnectionError:
            return response  # the client left (it may stop a stream that ignores max_tokens)
        sent += count
        log.tokens_sent[slot] = sent
        chunk_index += 1
    usage: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": sent, "total_tokens": prompt_tokens + sent}
    if behaviour.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": behaviour.cached_tokens}
    usage_overrides = {path: value for path, value in behaviour.overrides.items() if _is_usage(path)}
    if (body.get("stream_options") or {}).get("include_usage") or usage_overrides:
        usage_event = overridden({"object": "text_completion", "choices": [], "usage": usage}, usage_overrides)
        await response.write(_event(usage_event))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _is_usage(path: str) -> bool:
    return path == USAGE_PATH or path.startswith(USAGE_PATH + ".")


def overridden(event: dict, overrides: Mapping[str, object]) -> dict:
    """`event` with each override's value put at its dotted path (a copy: the original is kept)."""
    if not overrides:
        return event
    event = json.loads(json.dumps(event))
    for path, value in overrides.items():
        *steps, last = path.split(".")
        node: object = event
        for step in steps:
            node = _step(node, step)
        if isinstance(node, list) and last.isdigit() and int(last) < len(node):
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
    return event


def _step(node: object, step: str) -> object:
    """The child of `node` named by `step` (a dict key, or a list index); None where there is none (an earlier
    override put a scalar or a shorter list there). A dict's missing or scalar child becomes {}."""
    if isinstance(node, list):
        return node[int(step)] if step.isdigit() and int(step) < len(node) else None
    if isinstance(node, dict):
        if not isinstance(node.get(step), (dict, list)):
            node[step] = {}
        return node[step]
    return None


async def _fault(request: web.Request, response: web.StreamResponse, fault: str) -> web.StreamResponse:
    if fault == FAULT_MALFORMED:
        await response.write(b"data: {this is not json\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    elif fault == FAULT_STALL:
        await asyncio.sleep(3600)
    elif fault in (FAULT_DROP, FAULT_HTTP_500):
        # Mid-stream a server can no longer change the status: it can only cut the connection.
        if request.transport is not None:
            request.transport.close()
    return response


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def main(argv: list[str] | None = None) -> None:
    """Run the instrument as its own process (the load-generator benchmark uses it that way)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--first-token-ms", type=float, default=20.0)
    parser.add_argument("--chunk-interval-ms", type=float, default=5.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--output-share", type=float, default=1.0, help="answer this share of max_tokens (0, 1]")
    parser.add_argument("--fault", choices=FAULTS, default=FAULT_NONE, help="injected into every request")
    parser.add_argument("--fault-after-chunks", type=int, default=0)
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="share the port with other instrument processes (SO_REUSEPORT: the kernel spreads connections)",
    )
    parser.add_argument("--served-model", help="answer only this model name (others: 404)")
    parser.add_argument("--metrics-body", help="what GET /metrics returns (default: no /metrics, a 404)")
    parser.add_argument("--max-model-len", type=int, help="the context window /v1/models states (default: none)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="PATH=JSON",
        help="put this JSON value at this path of every event (e.g. usage.prompt_tokens='\"lots\"')",
    )
    parser.add_argument("--ignore-max-tokens", action="store_true", help="stream tokens until the client leaves")
    parser.add_argument("--first-event-bytes", type=int, default=0, help="pad the first token event to this size")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.override:
        path, _, value = item.partition("=")
        overrides[path] = json.loads(value)
    behaviour = replace(
        InstrumentBehaviour(),
        first_token_ms=args.first_token_ms,
        chunk_interval_ms=args.chunk_interval_ms,
        tokens_per_chunk=args.tokens_per_chunk,
        output_share=args.output_share,
        fault=args.fault,
        fault_after_chunks=args.fault_after_chunks,
        overrides=overrides,
        ignore_max_tokens=args.ignore_max_tokens,
        first_event_bytes=args.first_event_bytes,
    )
    app = make_app(
        behaviour, served_model=args.served_model, metrics_body=args.metrics_body, max_model_len=args.max_model_len
    )
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, reuse_port=args.reuse_port or None)


if __name__ == "__main__":
    main()
