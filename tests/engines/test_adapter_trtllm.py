"""The TensorRT-LLM adapter offline: its options YAML (KvCacheConfig), its `trtllm-serve serve` command checked
against the serve command's real help text (rendered from tensorrt_llm/commands/serve.py's click options, see
tests/data/shared/reference/README.md), the launch check against a stand-in `trtllm-serve` that answers --help as
the click group does, and the model name the server answers to."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from kvbench.engines.launch import LaunchedServer, command_problems, help_choices
from kvbench.engines.trtllm import REFERENCE_HELP, TRTLLMAdapter
from kvbench.settings import SettingsError
from tests.paths import REFERENCE  # noqa: E402

SERVE_HELP = REFERENCE / next(iter(REFERENCE_HELP.values()))
GROUP_HELP = REFERENCE / "trtllm-serve-00209af-group-help.txt"


def _adapter(tmp_path: Path, **settings) -> TRTLLMAdapter:
    return TRTLLMAdapter({"model": "/models/any", "port": 8126, **settings}, tmp_path)


def test_options_yaml_carries_the_kv_cache_config_and_the_metric_switches(tmp_path):
    adapter = _adapter(
        tmp_path,
        kv_dtype="fp8",
        block_reuse=True,
        host_cache_gib=64,
        free_gpu_memory_fraction=0.85,
        tokens_per_block=16,
        extra_options={"kv_cache_config": {"enable_partial_reuse": False}, "max_beam_width": 1},
    )
    options = yaml.safe_load(adapter.server.plan.files["trtllm-options.yaml"])
    assert options == {
        "kv_cache_config": {
            "dtype": "fp8",
            "enable_block_reuse": True,
            "host_cache_size": 64 * 2**30,
            "free_gpu_memory_fraction": 0.85,
            "tokens_per_block": 16,
            "enable_partial_reuse": False,
        },
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
        "max_beam_width": 1,
    }


@pytest.mark.parametrize(
    "settings",
    [
        {"block_reuse": True},
        {
            "block_reuse": True,
            "host_cache_gib": 200,
            "tp_size": 8,
            "max_seq_len": 16384,
            "max_num_tokens": 8192,
            "max_batch_size": 64,
            "backend": "pytorch",
        },
        {"block_reuse": False, "backend": "tensorrt"},
    ],
)
def test_serve_command_is_accepted_by_the_serve_help_of_its_version(tmp_path, settings):
    plan = _adapter(tmp_path, **settings).server.plan
    assert plan.command[:3] == ("trtllm-serve", "serve", "/models/any")
    assert command_problems(plan.command, SERVE_HELP.read_text()) == []
    assert plan.command[plan.command.index("--extra_llm_api_options") + 1] == str(
        (tmp_path / "trtllm-options.yaml").resolve()
    )
    assert plan.metrics_path == "/prometheus/metrics" and plan.help_command == ("trtllm-serve", "serve", "--help")
    assert help_choices(SERVE_HELP.read_text(), "--backend") == {"pytorch", "tensorrt", "_autodeploy"}


def test_the_group_help_lists_no_serve_flag(tmp_path):
    """Why the check asks `serve --help`: the group's own help would refuse every flag as unknown."""
    plan = _adapter(tmp_path).server.plan
    problems = command_problems(plan.command, GROUP_HELP.read_text())
    assert "unknown flag --port" in problems and "unknown flag --extra_llm_api_options" in problems


# A stand-in trtllm-serve: `--help` prints the click group's help, `serve --help` the serve command's (the committed
# real texts), `serve MODEL ...` stays up until stopped.
STAND_IN = textwrap.dedent("""\
    #!{python}
    import sys, time
    args = sys.argv[1:]
    if args == ["--help"]:
        print(open({group!r}).read()); sys.exit(0)
    if args == ["serve", "--help"]:
        print(open({serve!r}).read()); sys.exit(0)
    if args[:1] == ["serve"]:
        time.sleep(60); sys.exit(0)
    print("Error: No such command", file=sys.stderr); sys.exit(2)
""")


def test_launch_checks_flags_against_the_serve_command_help(tmp_path):
    executable = tmp_path / "bin" / "trtllm-serve"
    executable.parent.mkdir()
    executable.write_text(STAND_IN.format(python=sys.executable, group=str(GROUP_HELP), serve=str(SERVE_HELP)))
    os.chmod(executable, 0o755)
    adapter = _adapter(tmp_path / "engine", executable=str(executable), tp_size=8, host_cache_gib=16)
    server: LaunchedServer = adapter.server
    try:
        server.start()  # raises EngineError if a flag is refused
        assert "--extra_llm_api_options" in (tmp_path / "engine" / "engine-help.txt").read_text()
    finally:
        server.stop()


def test_served_model_is_a_directory_basename_or_the_name_as_given(tmp_path):
    model_dir = tmp_path / "Qwen2.5-72B-Instruct-FP8"
    model_dir.mkdir()
    assert _adapter(tmp_path, model=str(model_dir)).endpoint.model == "Qwen2.5-72B-Instruct-FP8"
    assert _adapter(tmp_path, model="Qwen/Qwen2.5-72B-Instruct").endpoint.model == "Qwen/Qwen2.5-72B-Instruct"


def test_cache_reset_only_by_restart(tmp_path):
    assert _adapter(tmp_path).capabilities.cache_reset is False
    assert _adapter(tmp_path).reset_cache() is False
    assert _adapter(tmp_path, restart_to_reset=True).capabilities.cache_reset is True


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(SettingsError, match="kv_dtype 'fp8_e5m2' is not one of auto, fp8, nvfp4"):
        _adapter(tmp_path, kv_dtype="fp8_e5m2")
    with pytest.raises(SettingsError, match=r"unknown key 'host_cache_size' \(did you mean 'host_cache_gib'"):
        _adapter(tmp_path, host_cache_size=10)
