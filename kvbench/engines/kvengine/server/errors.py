"""Every error the server gives in the OpenAI shape (`{"error": {message, type, param, code}}`), and the edge
cases of HTTP itself: a client that leaves, a request aiohttp cannot parse.

- `openai_errors` (middleware): a RequestError, aiohttp's own 404/405/413, or anything unexpected (a 500, one
  ERROR line with its traceback: that one is a bug) becomes a JSON error. A client that left (the write
  failed) is one debug line and `kvbench:client_disconnects_total`; before, 300 streaming clients leaving
  logged 300 ERROR tracebacks (`Cannot write to closing transport`).
- A request aiohttp's parser refuses (a 100 kB header, a malformed request line) used to be answered, and
  logged, with the first 100 bytes of the offending line: for `Authorization`, the start of the key.
  `NamesOnlyRequestHandler` answers 431 (a header or the request line too long) or 400 naming only the kind
  of error, and logs one line without the bytes. No header value is echoed anywhere. `AppRunner` is
  aiohttp's, serving connections with that handler.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

from kvbench.engines.kvengine.server.protocol import RequestError
from kvbench.engines.kvengine.server.server_metrics import ServerMetrics

log = logging.getLogger("kvbench.serve")
SERVER_METRICS = web.AppKey("server_metrics", ServerMetrics)
CLIENT_LEFT_STATUS = 499  # nobody reads it; the access log (if any) sees why the request ended
_KINDS = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def error_response(
    message: str,
    status: int = 400,
    kind: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    kind = kind or _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status=status, headers=headers
    )


@web.middleware
async def openai_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(str(exc), exc.status, exc.kind, exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(f"{request.method} {request.path}: {exc.reason}", exc.status)
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError: the client left mid-answer
        request.app[SERVER_METRICS].client_left()
        log.debug("client left during %s %s", request.method, request.path)
        return web.Response(status=CLIENT_LEFT_STATUS)
    except Exception as exc:  # noqa: BLE001 - a bug: the traceback is logged, the client gets JSON
        log.exception("error serving %s %s", request.method, request.path)
        return error_response(f"internal error ({type(exc).__name__})", 500, "server_error")


class NamesOnlyRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering requests its parser refuses without echoing their bytes."""

    def handle_error(
        self, request, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status != 400 or exc is None:
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong):
            status, text = 431, (f"a request header or the request line is longer than {exc.args[1]} bytes; shorten it")
        else:
            text = f"the request is not valid HTTP ({type(exc).__name__}); fix the client"
        log.info("refused a request from %s: %s", request.remote, text)  # never the offending bytes
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        response = error_response(text, status)
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return NamesOnlyRequestHandler(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """`web.AppRunner` whose connections use `NamesOnlyRequestHandler`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _Server(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )
