"""Administration needs the admin key once any key is configured: a tenant's key cannot flush every tenant's
cache or read every tenant's counters; `metrics_open` opens /metrics alone; /health is always open."""

from __future__ import annotations

import json
import urllib.request

import pytest

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.settings.config import EngineConfig

from .server_fixture import serving

ADMIN = "k-admin"
BODY = {"model": "tiny", "prompt": list(range(300, 340)), "max_tokens": 2, "temperature": 0, "ignore_eos": True}


def call(url, method, path, key=None, body=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def engine(tmp_path=None) -> Engine:
    tenants = None
    if tmp_path is not None:
        tenants = tmp_path / "tenants.yaml"
        tenants.write_text("tenants:\n  acme:\n    api_keys: [k-acme]\n  beta:\n    api_keys: [k-beta]\n")
    return Engine(
        EngineConfig(
            kv_capacity=1024,
            max_model_len=512,
            served_model_name="tiny",
            tenants_file=str(tenants) if tenants else None,
        ),
        tiny_loaded_model(5),
    )


@pytest.fixture(scope="module")
def tenants_url(tmp_path_factory):
    with serving(engine(tmp_path_factory.mktemp("admin")), admin_key=ADMIN) as base:
        yield base


@pytest.mark.parametrize("method, path", [("POST", "/reset_prefix_cache"), ("GET", "/metrics")])
def test_with_a_tenants_file_admin_endpoints_need_the_admin_key(tenants_url, method, path):
    assert call(tenants_url, "POST", "/v1/completions", "k-acme", BODY)[0] == 200
    assert call(tenants_url, method, path)[0] == 401
    assert call(tenants_url, method, path, "k-nobody")[0] == 401
    status, body = call(tenants_url, method, path, "k-acme")
    assert status == 403 and "admin key" in body
    status, body = call(tenants_url, method, path, ADMIN)
    assert status == 200
    if path == "/metrics":
        assert 'tenant="acme"' in body


def test_models_needs_a_tenant_key_and_health_needs_none(tenants_url):
    assert call(tenants_url, "GET", "/v1/models")[0] == 401
    assert call(tenants_url, "GET", "/v1/models", "k-beta")[0] == 200
    assert call(tenants_url, "GET", "/health")[0] == 200


def test_a_tenant_cannot_reset_the_cache_another_tenant_relies_on(tenants_url):
    first = json.loads(call(tenants_url, "POST", "/v1/completions", "k-beta", BODY)[1])
    assert call(tenants_url, "POST", "/reset_prefix_cache", "k-acme")[0] == 403
    again = json.loads(call(tenants_url, "POST", "/v1/completions", "k-beta", BODY)[1])
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert first["choices"][0]["text"] == again["choices"][0]["text"]


def test_a_single_api_key_administers_unless_an_admin_key_is_set():
    with serving(engine(), api_key="k-one") as url:
        assert call(url, "POST", "/reset_prefix_cache")[0] == 401
        assert call(url, "GET", "/metrics")[0] == 401
        assert call(url, "POST", "/reset_prefix_cache", "k-one")[0] == 200
        assert call(url, "GET", "/v1/models")[0] == 401
    with serving(engine(), api_key="k-one", admin_key=ADMIN) as url:
        assert call(url, "POST", "/reset_prefix_cache", "k-one")[0] == 403
        assert call(url, "POST", "/reset_prefix_cache", ADMIN)[0] == 200
        assert call(url, "POST", "/v1/completions", ADMIN, BODY)[0] == 200  # the admin may use the model too


def test_an_admin_key_alone_guards_administration_and_leaves_inference_open():
    with serving(engine(), admin_key=ADMIN) as url:
        assert call(url, "POST", "/v1/completions", None, BODY)[0] == 200
        assert call(url, "GET", "/v1/models")[0] == 200
        assert call(url, "POST", "/reset_prefix_cache")[0] == 401
        assert call(url, "POST", "/reset_prefix_cache", ADMIN)[0] == 200


def test_metrics_open_opens_metrics_and_nothing_else(tmp_path):
    with serving(engine(tmp_path), admin_key=ADMIN, metrics_open=True) as url:
        status, body = call(url, "GET", "/metrics")
        assert status == 200 and "kvbench:" in body
        assert call(url, "POST", "/reset_prefix_cache")[0] == 401
        assert call(url, "POST", "/v1/completions", None, BODY)[0] == 401


def test_a_key_is_accepted_only_whole(tenants_url):
    for near in ("k-acm", "k-acmex", "K-ACME", "k-admi", ADMIN + "x", "k-acmé"):
        assert call(tenants_url, "POST", "/v1/completions", near, BODY)[0] == 401
        assert call(tenants_url, "POST", "/reset_prefix_cache", near)[0] == 401


def test_an_unknown_key_is_a_401_where_only_an_admin_key_is_set():
    with serving(engine(), admin_key=ADMIN) as url:
        assert call(url, "POST", "/reset_prefix_cache", "k-guess")[0] == 401
        assert call(url, "GET", "/metrics", "k-guess")[0] == 401


def test_the_endpoint_adapter_administers_with_its_admin_key_and_runs_with_a_tenants_key(tenants_url, tmp_path):
    """`kvbench run --engine endpoint` against a server with tenant keys: the run's key is a tenant's, the cache
    reset and the /metrics scrape need the admin key (`admin_key` setting); without it the reset is refused."""
    from kvbench.engines.base import EngineError
    from kvbench.engines.endpoint import EndpointAdapter

    settings = {"url": tenants_url, "model": "tiny", "api_key": "k-acme", "reset_path": "/reset_prefix_cache"}
    with pytest.raises(EngineError, match="403"):
        EndpointAdapter(settings, tmp_path).reset_cache()
    admin = EndpointAdapter({**settings, "admin_key": ADMIN}, tmp_path)
    assert admin.reset_cache() is True
    assert admin.scrape_metrics()  # Prometheus samples, read with the admin key
    assert admin.endpoint.api_key == "k-acme"  # requests still go as the tenant
