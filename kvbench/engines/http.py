"""Small synchronous HTTP calls adapters make between runs (health, cache reset, /metrics)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True)
class HttpReply:
    status: int | None  # None: no answer at all (refused, timed out)
    body: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def request(
    method: str, url: str, timeout_s: float = 5.0, api_key: str | None = None, json_body: object | None = None
) -> HttpReply:
    """One call; never raises for HTTP or network trouble (see `HttpReply.status` and `.error`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    data = b"" if method == "POST" else None
    if json_body is not None:
        data = json.dumps(json_body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            return HttpReply(response.status, response.read().decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as exc:
        return HttpReply(exc.code, exc.read().decode("utf-8", errors="replace"), str(exc))
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return HttpReply(None, "", f"{type(exc).__name__}: {reason}")
