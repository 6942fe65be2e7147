"""A local HTTP server that answers a cache-reset POST as a real engine does, refusing the first `refusals`
resets: the handler class (one per engine, copying its documented answer) decides the refusal and the accept."""

from __future__ import annotations

import contextlib
import http.server
import threading


class ResetAnswers(http.server.BaseHTTPRequestHandler):
    """Subclasses set `answer(accepted) -> (status, body bytes, content type)`; `server.paths` records the POSTs."""

    def answer(self, accepted: bool) -> tuple[int, bytes, str]:
        raise NotImplementedError

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.server.paths.append(self.path)
        status, body, content_type = self.answer(len(self.server.paths) > self.server.refusals)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def reset_server(handler: type[ResetAnswers], refusals: int):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.refusals, server.paths = refusals, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
