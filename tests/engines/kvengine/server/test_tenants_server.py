"""Tenants over HTTP: keys decide identity (401 / 403), usage reports cached tokens by tier, /metrics is
scraped by a real Prometheus, and every expression of the Grafana dashboard names an exported metric."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import kvbench.engines.kvengine as kvengine_package
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.settings.config import EngineConfig

from ..runtime.tiers_fixtures import free_port
from .server_fixture import serving

PROMPT = list(range(300, 380))
ADMIN = "k-admin"
DASHBOARD = Path(kvengine_package.__file__).parent / "grafana" / "kvengine-dashboard.json"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    path = tmp_path_factory.mktemp("tenants") / "tenants.yaml"
    path.write_text(
        "tenants:\n  acme:\n    api_keys: [k-acme]\n    quota_pages: 100\n  beta:\n    api_keys: [k-beta]\n"
    )
    config = EngineConfig(
        kv_capacity=4096, max_model_len=512, served_model_name="tiny", tenants_file=str(path), host_capacity=1024
    )
    with serving(Engine(config, tiny_loaded_model(5)), admin_key=ADMIN) as base:
        yield base


def post(url, body, key=None, headers=None):
    head = {"Content-Type": "application/json", **(headers or {})}
    if key:
        head["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=head)
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


BODY = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True}


def test_unknown_or_missing_keys_get_401_and_claiming_another_tenant_gets_403(url):
    assert post(url, BODY)[0] == 401
    assert post(url, BODY, "k-nobody")[0] == 401
    status, body = post(url, {**BODY, "tenant": "beta"}, "k-acme")
    assert status == 403 and body["error"]["param"] == "tenant"
    assert post(url, BODY, "k-acme", {"X-Tenant": "beta"})[0] == 403
    assert post(url, {**BODY, "tenant": "acme"}, "k-acme")[0] == 200


def test_usage_reports_cached_tokens_by_tier_and_tenants_do_not_share(url):
    prompt = list(range(200, 264)) + [5]
    first = post(url, {**BODY, "prompt": prompt}, "k-beta")[1]["usage"]["prompt_tokens_details"]
    second = post(url, {**BODY, "prompt": prompt}, "k-beta")[1]["usage"]["prompt_tokens_details"]
    other = post(url, {**BODY, "prompt": prompt}, "k-acme")[1]["usage"]["prompt_tokens_details"]
    assert first == {"cached_tokens": 0, "cached_tokens_by_tier": {}}
    assert second == {"cached_tokens": 64, "cached_tokens_by_tier": {"device": 64}}
    assert other["cached_tokens"] == 0  # strict isolation by default


def exported_names(url) -> set[str]:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(request) as reply:
        text = reply.read().decode()
    # Families from the TYPE lines: a labelled counter is declared before its first sample exists.
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            names.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
    return names


def test_every_dashboard_expression_names_an_exported_metric(url):
    post(url, BODY, "k-acme")
    names = exported_names(url)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 6
    for expr in exprs:
        used = set(re.findall(r"kvbench:[a-z_:]+", expr))
        assert used, expr
        assert used <= names, f"{expr}: {sorted(used - names)} not exported"
    for wanted in (
        "kvbench:tenant_cached_tokens_total",
        "kvbench:tenant_kv_evictions_total",
        "kvbench:tenant_kv_quota_usage_ratio",
        "kvbench:tenant_kv_pages",
        "kvbench:tenant_kv_moves_total",
    ):
        assert any(wanted in e for e in exprs), wanted


@pytest.mark.slow
def test_a_real_prometheus_scrapes_per_tenant_metrics(url, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not on PATH: install Debian's prometheus package")
    post(url, BODY, "k-acme")
    target = urllib.parse.urlparse(url).netloc
    (tmp_path / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: kvengine\n"
        f"    authorization: {{credentials: {ADMIN}}}\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        query = urllib.parse.quote('kvbench:tenant_prompt_tokens_total{tenant="acme"}')
        deadline, result = time.monotonic() + 60, []
        while time.monotonic() < deadline and not result:
            time.sleep(1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query={query}") as reply:
                    result = json.loads(reply.read())["data"]["result"]
            except OSError:
                continue
        assert result, "prometheus never scraped kvbench:tenant_prompt_tokens_total"
        assert float(result[0]["value"][1]) >= 80
    finally:
        process.terminate()
        process.wait(20)
