"""One definition per engine setting: YAML mapping -> EngineConfig -> `kvbench serve` argv -> the same config.

The round trips iterate over every field, each set to a value that is not its default, so a field added to
EngineConfig without a flag (or with a flag that loses its value) fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

import pytest

from kvbench.engines.kvengine.adapter import KVEngineAdapter, KVEngineSettings
from kvbench.engines.kvengine.core.kv_format import KVDtype, KVFormat, ScaleMode
from kvbench.engines.kvengine.server.main import add_arguments
from kvbench.engines.kvengine.settings.config import TIER_SECRET_ENV, EngineConfig, IsolationMode, ServeOptions, setting
from kvbench.engines.kvengine.settings.flags import add_flags, from_args, to_argv
from kvbench.engines.process import child_environment
from kvbench.settings import SettingsError, build

# A value other than the default for every EngineConfig field, as YAML would give it.
NON_DEFAULT_ENGINE = {
    "model": "tiny-random",
    "kv_dtype": "fp8_e4m3",
    "kv_scale": "channel",
    "kv_capacity": 4096,
    "kv_capacity_bytes": 1 << 20,
    "page_size": 32,
    "max_num_seqs": 3,
    "max_step_tokens": 96,
    "max_prefill_beside_decodes": 24,
    "decode_stall_factor": 2.5,
    "prepacked_weights": False,
    "prefix_caching": False,
    "device": "cuda:1",
    "tensor_parallel_size": 2,
    "memory_utilization": 0.5,
    "compute_dtype": "bfloat16",
    "max_model_len": 777,
    "served_model_name": "tiny",
    "threads": 2,
    "cuda_graphs": True,
    "host_capacity": 1024,
    "disk_capacity": 2048,
    "disk_dir": "/tmp/kv-disk",
    "remote_url": "redis://127.0.0.1:6379/1",
    "device_ttl_s": 2.5,
    "host_ttl_s": 1e6,
    "tier_interval_s": 0.125,
    "tenants_file": "tenants.yaml",
    "isolation": "shared-prefix",
    "tier_secret": "s3",
    "tier_secret_file": "/run/secrets/tier",
}
NON_DEFAULT_SERVE = {
    "host": "0.0.0.0",
    "port": 9999,
    "api_key": "k1",
    "admin_key": "k2",
    "metrics_open": True,
    "step_log": "steps.jsonl",
    "stall_timeout_s": 2.5,
}


SECRETS = ("tier_secret",)  # no flag: argv is public on the machine


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def init_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


@pytest.mark.parametrize(
    "cls, values", [(EngineConfig, NON_DEFAULT_ENGINE), (ServeOptions, NON_DEFAULT_SERVE)], ids=["engine", "serve"]
)
def test_every_setting_round_trips_through_the_serve_argv(cls, values):
    assert set(values) == init_names(cls), "give every field a non-default value here"
    config = build(cls, values, "test")
    for name, value in values.items():
        assert getattr(config, name) != getattr(cls(), name), name
    args = serve_parser().parse_args(to_argv(config))
    assert from_args(cls, args) == dataclasses.replace(config, **{name: None for name in SECRETS if name in values})
    assert to_argv(cls()) == []  # defaults need no flag: the child's defaults are the same definition


def test_the_adapter_launches_the_server_with_its_settings_and_nothing_else(tmp_path):
    adapter = KVEngineAdapter(
        {
            **NON_DEFAULT_ENGINE,
            "tenants_file": None,
            "api_key": "sk-run",
            "port": 8123,
            "extra_args": ["--metrics-open"],
        },
        tmp_path,
    )
    command = adapter.command()
    assert command[1:3] == ["-m", "kvbench.engines.kvengine.server.main"]
    args = serve_parser().parse_args(command[3:])
    # The tier secret travels in the environment, never in argv (ps and logs show argv).
    assert not any("s3" == part for part in command) and adapter._process.env[TIER_SECRET_ENV] == "s3"
    assert from_args(EngineConfig, args) == dataclasses.replace(adapter.settings.engine, tier_secret=None)
    assert from_args(ServeOptions, args) == dataclasses.replace(adapter.serve_options(), metrics_open=True)
    assert (args.port, args.api_key, args.step_log) == (8123, "sk-run", str(tmp_path / "steps.jsonl"))


@pytest.mark.parametrize("spin", [None, "7"])
def test_the_server_gets_the_openmp_wait_settings_unless_the_environment_names_its_own(tmp_path, monkeypatch, spin):
    """The launched server's OpenMP waits passively after a spin (`openmp.ENV`); a GOMP_SPINCOUNT of the user's
    (the tests' own is 0) is what the server gets instead."""
    if spin is None:
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    else:
        monkeypatch.setenv("GOMP_SPINCOUNT", spin)
    env = child_environment(os.environ, KVEngineAdapter({}, tmp_path)._process.env)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    if spin:
        assert env["GOMP_SPINCOUNT"] == spin
    else:
        assert int(env["GOMP_SPINCOUNT"]) > 0  # a spin first


def test_the_adapter_fills_only_the_defaults_that_depend_on_it(tmp_path):
    settings = KVEngineSettings.parse({"disk_capacity": 512}, tmp_path)
    assert settings.engine.disk_dir == str(tmp_path / "kv-disk")
    assert settings.engine.served_model_name == "kvengine"
    assert KVEngineSettings.parse({"served_model_name": "m"}, tmp_path).engine.served_model_name == "m"


def test_yaml_names_become_values_once():
    config = build(EngineConfig, {"kv_dtype": "fp8_e5m2", "isolation": "shared-prefix"}, "engine.kvengine")
    assert config.isolation is IsolationMode.SHARED_PREFIX and config.kv_dtype is KVDtype.FP8_E5M2
    assert config.kv_format == KVFormat(KVDtype.FP8_E5M2, ScaleMode.TENSOR)
    assert EngineConfig(kv_scale="channel").kv_format == KVFormat(KVDtype.FP32)  # fp32 has no scale to choose


@pytest.mark.parametrize(
    "values, message",
    [
        ({"kv_dtype": "fp9"}, "kv_dtype 'fp9' is not one of fp32, bf16, fp16, fp8_e5m2, fp8_e4m3"),
        ({"kv_scale": "none"}, "kv_scale 'none' is not one of tensor, channel"),
        ({"isolation": "private"}, "isolation 'private' is not one of strict, shared-prefix"),
        ({"kv_capacity": 0}, "engine.kvengine.kv_capacity: must be >= 1 tokens"),
        ({"kv_capacity": 8}, "kv_capacity (8) must hold at least one page of 16 tokens"),
        ({"device_ttl_s": 700}, "device_ttl_s (700) must be <= host_ttl_s (600)"),
        ({"disk_capacity": 64}, "disk_capacity > 0 needs disk_dir"),
        ({"kv_capacty": 1}, "unknown key 'kv_capacty' (did you mean 'kv_capacity'?)"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(values, message):
    with pytest.raises(SettingsError, match="^engine.kvengine") as error:
        build(EngineConfig, values, "engine.kvengine")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_flag_out_of_range_is_the_same_one_line_error():
    with pytest.raises(SettingsError, match="page_size: must be >= 1 tokens, got 0"):
        from_args(EngineConfig, serve_parser().parse_args(["--page-size", "0"]))


@dataclass(frozen=True)
class _Shapes:
    names: tuple[str, ...] = setting((), "several values")
    limit: float | None = setting(None, "optional", ge=0)
    on: bool = setting(True, "a switch")


def test_tuples_optionals_and_bools_round_trip():
    parser = argparse.ArgumentParser()
    add_flags(parser, _Shapes)
    for value in (_Shapes(), _Shapes(("a", "b"), 0.5, False), _Shapes(("x",), 0.0)):
        assert from_args(_Shapes, parser.parse_args(to_argv(value))) == value
    assert to_argv(_Shapes(("a", "b"), None, False)) == ["--names", "a", "b", "--no-on"]


def test_kv_capacity_auto_round_trips_and_a_bad_word_is_refused_naming_the_field():
    config = build(EngineConfig, {"kv_capacity": "auto"}, "engine.kvengine")
    assert from_args(EngineConfig, serve_parser().parse_args(to_argv(config))) == config
    with pytest.raises(SettingsError, match="kv_capacity 'lots' must be a number of tokens or 'auto'"):
        build(EngineConfig, {"kv_capacity": "lots"}, "engine.kvengine")
    with pytest.raises(SettingsError, match="kv_capacity 1.5 must be a number of tokens"):
        build(EngineConfig, {"kv_capacity": 1.5}, "engine.kvengine")


def test_serve_help_prints_every_setting_with_its_help(capsys):
    """`kvbench serve --help` renders each setting's help as written (a '%' in it is text, not argparse's format)."""
    from kvbench.engines.kvengine.server.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(EngineConfig):
        if f.init and f.metadata.get("help"):
            assert f"--{f.name.replace('_', '-')}" in text
    assert "14-24%" in text  # the prepacked weights' measured gain, printed as one percent sign


def test_the_tier_secret_comes_from_a_file_or_the_environment_never_from_argv(tmp_path, monkeypatch):
    """`kvbench serve --tier-secret S` put S in /proc/PID/cmdline and `ps`: there is no such flag now."""
    from kvbench.engines.kvengine.server.main import tier_secret

    with pytest.raises(SystemExit):
        serve_parser().parse_args(["--tier-secret", "S"])  # refused, not taken as --tier-secret-file's prefix
    assert serve_parser().parse_args(["--tier-secret-file", "F"]).tier_secret_file == "F"
    secret = tmp_path / "tier"
    secret.write_text("from-file\nsecond line ignored\n")
    monkeypatch.setenv(TIER_SECRET_ENV, "from-env")
    assert tier_secret(str(secret)) == "from-file"
    assert tier_secret(None) == "from-env"
    monkeypatch.delenv(TIER_SECRET_ENV)
    assert tier_secret(None) is None
    with pytest.raises(SettingsError, match="tier_secret_file: cannot read"):
        tier_secret(str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match="tier_secret_file: the first line"):
        tier_secret(str(tmp_path / "empty"))
