"""The SGLang adapter offline: commands checked against sglang 0.5.23's --help, counters against its /metrics.
SGLang needs a GPU for the real run (ci/gpu-smoke.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.engines.base import EngineError
from kvbench.engines.launch import command_problems
from kvbench.engines.prometheus import parse_samples, sum_samples
from kvbench.engines.sglang import SGLangAdapter
from kvbench.harness.reconcile import reconcile
from kvbench.measure.records import RequestRecord
from kvbench.settings import SettingsError
from tests.engines.reset_server import ResetAnswers, reset_server
from tests.paths import REFERENCE  # noqa: E402

SGLANG_HELP = REFERENCE / "sglang-0.5.23-launch-server-help.txt"
SGLANG_METRICS = REFERENCE / "sglang-0.5.23-cpu-metrics.txt"


def _adapter(tmp_path: Path, **settings) -> SGLangAdapter:
    return SGLangAdapter({"model": "/models/any", "python": "/venv/bin/python", "port": 8125, **settings}, tmp_path)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"kv_cache_dtype": "fp8_e4m3", "radix_cache": False, "tp_size": 8, "context_length": 32768},
        {
            "kv_cache_dtype": "fp8_e5m2",
            "hierarchical_cache": True,
            "hicache_ratio": 2.0,
            "hicache_write_policy": "write_through",
            "hicache_storage_backend": "file",
            "chunked_prefill_size": 4096,
            "mem_fraction_static": 0.85,
            "page_size": 16,
        },
        {"hierarchical_cache": True, "hicache_size": 200, "max_prefill_tokens": 16384, "quantization": "fp8"},
    ],
)
def test_every_flag_and_choice_is_in_the_reference_help(tmp_path, settings):
    command = _adapter(tmp_path, **settings).server.plan.command
    assert command[:3] == ("/venv/bin/python", "-m", "sglang.launch_server")
    assert command_problems(command, SGLANG_HELP.read_text()) == []
    assert "--enable-metrics" in command and "--enable-cache-report" in command


def test_settings_map_to_their_flags(tmp_path):
    text = " ".join(_adapter(tmp_path, kv_cache_dtype="fp8_e4m3", radix_cache=False, tp_size=8).server.plan.command)
    assert "--kv-cache-dtype fp8_e4m3" in text and "--disable-radix-cache" in text and "--tp-size 8" in text
    text = " ".join(_adapter(tmp_path, hierarchical_cache=True, hicache_ratio=2.0).server.plan.command)
    assert "--enable-hierarchical-cache --hicache-ratio 2" in text and "--kv-cache-dtype" not in text


def test_hicache_options_without_hierarchical_cache_are_refused(tmp_path):
    with pytest.raises(SettingsError, match="hicache_ratio need hierarchical_cache: true"):
        _adapter(tmp_path, hicache_ratio=2.0)
    with pytest.raises(SettingsError, match="hierarchical_cache needs radix_cache: true"):
        _adapter(tmp_path, hierarchical_cache=True, radix_cache=False)
    with pytest.raises(SettingsError, match="kv_cache_dtype 'fp8' is not one of"):
        _adapter(tmp_path, kv_cache_dtype="fp8")


def test_reference_metrics_hold_the_counters_reconciliation_uses():
    samples = parse_samples(SGLANG_METRICS.read_text())
    cached = sum_samples(samples, "sglang:cached_tokens_total")
    assert cached == 8346
    assert sum_samples(samples, "sglang:realtime_tokens_total", mode="prefill_cache") == cached
    assert sum_samples(samples, "sglang:realtime_tokens_total", mode="prefill_compute") == 8313
    result = reconcile([RequestRecord("r", "1", "s", "t", 0, 0, cached_tokens=8346)], {}, samples)
    assert (result.counter, result.agree) == ("sglang:cached_tokens_total", True)


# SGLang 0.5's /flush_cache (python/sglang/srt/entrypoints/http_server.py): one text, 200 when it flushed,
# 400 when requests were running or waiting and it did not.
FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
    "requests, the operation will not be performed.)\n"
)


class _FlushAnswers(ResetAnswers):
    def answer(self, accepted):
        return (200 if accepted else 400), FLUSH_TEXT.encode(), "text/plain"


def test_flush_retries_while_sglang_answers_400_with_requests_running(tmp_path):
    with reset_server(_FlushAnswers, refusals=2) as server:
        adapter = _adapter(tmp_path, port=server.server_address[1], radix_cache=False)
        assert adapter.reset_cache() is True
        assert server.paths == ["/flush_cache"] * 3


def test_a_flush_sglang_keeps_refusing_is_a_clear_error(tmp_path):
    with reset_server(_FlushAnswers, refusals=10**6) as server:
        adapter = _adapter(tmp_path, port=server.server_address[1], radix_cache=False, reset_timeout_s=0.5)
        with pytest.raises(EngineError, match=r"the engine refused \d+ times over 0.5 s \(400: requests still running"):
            adapter.reset_cache()
        assert len(server.paths) >= 2
