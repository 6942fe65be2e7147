"""The endpoint adapter asks the server which model it serves when none is given, as `vllm bench serve` does,
and records the model it used."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvbench.cli.main import main
from kvbench.engines.base import EngineError
from kvbench.engines.endpoint import EndpointAdapter, served_models

from ..harness.instrument_fixture import instrument_process


@contextlib.contextmanager
def models_server(status: int, body: str):
    """A server whose GET /v1/models answers `status` with `body`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _ready(url, tmp_path, **settings):
    adapter = EndpointAdapter({"url": url, **settings}, tmp_path)
    adapter.wait_healthy(5)
    return adapter


def test_without_a_model_the_first_served_one_is_used_and_recorded(tmp_path):
    body = json.dumps({"object": "list", "data": [{"id": "Qwen/Qwen2.5-0.5B"}, {"id": "lora-a"}]})
    with models_server(200, body) as url:
        adapter = _ready(url + "/v1", tmp_path)
    assert adapter.endpoint.model == "Qwen/Qwen2.5-0.5B"
    assert adapter.describe()["model"] == "Qwen/Qwen2.5-0.5B"
    assert adapter.describe()["model_source"] == "/v1/models"
    with models_server(200, body) as url:
        given = _ready(url, tmp_path, model="lora-a")
    assert given.endpoint.model == "lora-a" and given.describe()["model_source"] == "settings"


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (404, "not here", "answered HTTP 404"),
        (200, "<html>", "is not JSON"),
        (200, json.dumps({"data": []}), "lists no model"),
        (200, json.dumps({"data": [{"name": "x"}]}), "data[0] has no string `id`"),
    ],
)
def test_a_server_that_does_not_name_its_model_asks_for_model(status, body, says, tmp_path):
    with models_server(status, body) as url, pytest.raises(EngineError, match="give --model") as error:
        _ready(url, tmp_path)
    assert says in str(error.value)


def test_served_models_reads_the_openai_list_in_order():
    assert served_models('{"data": [{"id": "a"}, {"id": "b"}]}') == ["a", "b"]
    with pytest.raises(ValueError, match="no `data` list"):
        served_models("[1, 2]")


def test_a_run_on_a_url_without_model_uses_the_served_one(tmp_path):
    """The instrument answers only the model it serves (others get vLLM's 404): every request succeeds, and the
    model is in the entry's engine description."""
    with instrument_process("--served-model", "instrument") as (url, _):
        out = tmp_path / "run"
        # (--max-lag-ms: the client's lag on a loaded machine is not this test's subject; past it, exit 1)
        code = main(
            [
                "run",
                "--url",
                url,
                "--num-sessions",
                "2",
                "--num-requests",
                "4",
                "--max-lag-ms",
                "1000",
                "--out",
                str(out),
            ]
        )
    assert code == 0
    (entry,) = json.loads((out / "summary.json").read_text())["runs"]
    assert entry["summary"]["overall"]["errors"] == 0 and entry["summary"]["overall"]["completed"] == 4
    assert entry["engine_description"]["model"] == "instrument"
    rows = [json.loads(line) for line in (out / "requests_metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(row["ttft_ms"] is not None and row["sent_at"] for row in rows)
    (vllm_file,) = (out / "vllm").iterdir()
    assert json.loads(vllm_file.read_text())["model_id"] == "instrument"
