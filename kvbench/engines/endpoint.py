"""`endpoint`: an OpenAI-compatible server someone else started. kvbench only talks to it.

With no `model` given, the model is the first that the server's `/v1/models` lists (as `vllm bench serve`
does), asked once the server answers; the model used is recorded in the entry's engine description."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.base import Capabilities, Endpoint, EngineError
from kvbench.engines.http import request
from kvbench.engines.prometheus import parse_samples
from kvbench.settings import build

# Where the engines kvbench knows reset their prefix cache, in the order probed (all POST): vLLM's (served with
# VLLM_SERVER_DEV_MODE=1; our engine's is the same path, behind its admin key), then SGLang's.
KNOWN_RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")
AUTO = "auto"


@dataclass(frozen=True)
class EndpointSettings:
    """`url` is the server's base URL (with or without /v1). `reset_path` is POSTed before each point to empty
    the server's prefix cache: `auto` (the default) probes KNOWN_RESET_PATHS and keeps the first that answers
    2xx; a path uses that one (and a failure is an error); null never resets. Without a reset every output says
    "warm cache". `metrics_path` is scraped. Both send `admin_key` when given (a server with tenant keys keeps
    its admin endpoints from them), else `api_key`."""

    url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the first model the server's /v1/models lists
    api_key: str | None = None
    admin_key: str | None = None
    kv_dtype: str = "unknown"
    reset_path: str | None = AUTO
    metrics_path: str | None = "/metrics"
    output_token_ids: bool = False
    reachable_within_s: float = 5.0  # someone else's server should already be up: do not wait long

    def __post_init__(self) -> None:
        if "://" not in self.url:
            raise ValueError(f"url {self.url!r} has no scheme: did you mean http://{self.url}?")


class EndpointAdapter:
    name = "endpoint"

    def __init__(self, settings: Mapping[str, object], workdir: Path) -> None:
        self.settings = build(EndpointSettings, settings, "engine.endpoint")
        base = self.settings.url.rstrip("/")
        self._base = base[: -len("/v1")] if base.endswith("/v1") else base
        self._reset_path = None if self.settings.reset_path == AUTO else self.settings.reset_path
        self._probed = self.settings.reset_path != AUTO  # auto: the known paths are tried at the first reset
        self.reset_note: str | None = None  # why the cache is not reset (none of the known paths answered)
        self._model = self.settings.model
        self._model_source = "settings" if self._model is not None else None

    @property
    def endpoint(self) -> Endpoint:
        if self._model is None:
            raise EngineError("engine.endpoint: the model is not known before the server answered /v1/models")
        return Endpoint(self._base, self._model, self.settings.api_key)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            token_id_prompts=True,
            cached_token_reporting=True,
            output_token_ids=self.settings.output_token_ids,
            cache_reset=self.settings.reset_path is not None,  # auto: it may; reset_cache() says whether it did
        )

    def describe(self) -> Mapping[str, object]:
        return {
            "kv_dtype": self.settings.kv_dtype,
            "url": self._base,
            "model": self._model,
            "model_source": self._model_source,
            "reset_path": self._reset_path,
            **({"cache_reset_note": self.reset_note} if self.reset_note else {}),
        }

    @property
    def _admin_key(self) -> str | None:
        return self.settings.admin_key or self.settings.api_key

    def start(self) -> None:
        """Nothing to launch."""

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + min(timeout_s, self.settings.reachable_within_s)
        reply = None
        while True:
            reply = request(
                "GET", self._base + "/v1/models", timeout_s=min(5.0, timeout_s), api_key=self.settings.api_key
            )
            if reply.status is not None and reply.status < 500:
                # It answers HTTP; a 401/404 here is the server's business, not unreachability, unless the
                # model has to come from that answer.
                if self._model is None:
                    self._model = self._served_model(reply.status, reply.body)
                    self._model_source = "/v1/models"
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        raise EngineError(
            f"engine.endpoint: cannot reach {self._base} ({reply.error or reply.status}); "
            "check --url and that the server is running"
        )

    def model_problem(self) -> str | None:
        """Why the given model cannot be measured here, asked of /v1/models before the first request: it is not
        among those served. None when it is, when no model was given (the first served is taken), or when the
        server does not answer a list (wait_healthy reports an unreachable one)."""
        if self._model is None:
            return None
        reply = request(
            "GET",
            self._base + "/v1/models",
            timeout_s=min(5.0, self.settings.reachable_within_s),
            api_key=self.settings.api_key,
        )
        if reply.status != 200:
            return None
        try:
            served = served_models(reply.body)
        except ValueError:
            return None
        if self._model in served:
            return None
        return (
            f"model {self._model!r} is not served at {self._base} (its /v1/models lists "
            f"{', '.join(repr(name) for name in served)}): give --model {served[0]}"
        )

    def _served_model(self, status: int, body: str) -> str:
        if status != 200:
            raise EngineError(
                f"engine.endpoint: no model given and {self._base}/v1/models answered HTTP {status}; "
                "give --model (or settings.model)"
            )
        try:
            return served_models(body)[0]
        except ValueError as exc:
            raise EngineError(
                f"engine.endpoint: no model given and {self._base}/v1/models {exc}; give --model (or settings.model)"
            ) from None

    def reset_cache(self) -> bool:
        """Empty the server's prefix cache; False when it cannot (no reset path, or none of the known ones
        answered: the point then runs on a warm cache, and says so)."""
        if not self._probed:  # auto, first point: the probe's accepted POST is this point's reset
            self._probed = True
            self._reset_path = self._probe_reset_paths()
            return self._reset_path is not None
        if not self._reset_path:
            return False
        reply = request("POST", self._base + self._reset_path, api_key=self._admin_key)
        if not reply.ok or _refused(reply):
            raise EngineError(
                f"cache reset {self._reset_path} failed: {reply.error or reply.status} {reply.body[:200]}"
            )
        return True

    def _probe_reset_paths(self) -> str | None:
        """The first of KNOWN_RESET_PATHS the server accepts (2xx, not vLLM's `{"success": false}`), or None."""
        answers = []
        for path in KNOWN_RESET_PATHS:
            reply = request("POST", self._base + path, api_key=self._admin_key)
            if reply.ok and not _refused(reply):
                return path
            answers.append(f"POST {path}: {reply.error or reply.status}")
        self.reset_note = f"no cache reset path answered ({'; '.join(answers)}): warm cache"
        return None

    def scrape_metrics(self) -> Mapping[str, float] | None:
        if not self.settings.metrics_path:
            return None
        reply = request("GET", self._base + self.settings.metrics_path, api_key=self._admin_key)
        return parse_samples(reply.body) if reply.ok else None

    def stop(self) -> None:
        """Not ours to stop."""


def _refused(reply) -> bool:
    """vLLM answers 200 `{"success": false}` when it did not reset (blocks still held)."""
    try:
        body = json.loads(reply.body)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("success") is False


def served_models(body: str) -> list[str]:
    """The model ids of an OpenAI `/v1/models` answer (`{"data": [{"id": ...}, ...]}`), in its order; ValueError
    naming what is wrong (not JSON, no `data` list, an entry without a string `id`, an empty list)."""
    try:
        document = json.loads(body)
    except ValueError:
        raise ValueError(f"is not JSON: {body[:80]!r}") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ValueError("has no `data` list")
    ids = [entry.get("id") if isinstance(entry, dict) else None for entry in data]
    bad = next((index for index, model in enumerate(ids) if not isinstance(model, str) or not model), None)
    if bad is not None:
        raise ValueError(f"data[{bad}] has no string `id`")
    if not ids:
        raise ValueError("lists no model")
    return ids
