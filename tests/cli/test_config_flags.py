"""`kvbench run`'s flags derived from the experiment config's sections: each exposed field has a flag that sets
it (in a run from flags and over CONFIG.yaml), a flag left out keeps the config's value, and the field's range is
the flag's."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.cli.commands.run_cmd import config_from_args
from kvbench.cli.config_flags import SECTIONS, flag_of
from kvbench.cli.main import build_parser, main
from kvbench.harness.config import load_config_file

CONFIG = Path(__file__).resolve().parents[2] / "ci" / "nightly-cpu.yaml"

# A value for each exposed field that differs from its default, as flag text and as the config holds it.
VALUES = {
    "num_requests": ("7", 7),
    "duration_s": ("12.5", 12.5),
    "warmup_requests": ("3", 3),
    "api": ("chat", "chat"),
    "tokenizer": ("/tmp/tok", "/tmp/tok"),
    "max_lag_ms": ("25", 25.0),
    "workers": ("2", 2),
    "ttft_ms": ("500", 500.0),
    "tpot_ms": ("40", 40.0),
    "e2e_ms": ("9000", 9000.0),
    "seed": ("11", 11),
    "repeat": ("2", 2),
}
FIELDS = [(section, name) for section in SECTIONS for name in section.fields]


def _section(config, key):
    return config if key == "" else getattr(config, key)


def _argv(section, name) -> list[str]:
    flag = (section.fields[name] or (flag_of(name),))[0]
    return [flag, VALUES[name][0]]


@pytest.mark.parametrize("section, name", FIELDS, ids=[f"{s.key or 'top'}.{n}" for s, n in FIELDS])
@pytest.mark.parametrize("with_config", [False, True], ids=["flags", "config"])
def test_every_exposed_field_is_set_by_its_flag(section, name, with_config):
    if name == "ignore_eos":  # on by default: its flag turns it off
        argv, expected = ["--no-ignore-eos"], False
    else:
        argv, expected = _argv(section, name), VALUES[name][1]
    config = config_from_args(build_parser().parse_args(["run", *([str(CONFIG)] if with_config else []), *argv]))
    assert getattr(_section(config, section.key), name) == expected


def test_a_flag_left_out_keeps_the_configs_value():
    from_file = load_config_file(CONFIG)
    config = config_from_args(build_parser().parse_args(["run", str(CONFIG), "--seed", "5"]))
    assert (config.stop, config.client, config.slo, config.repeat) == (
        from_file.stop,
        from_file.client,
        from_file.slo,
        from_file.repeat,
    )
    assert config.seed == 5 != from_file.seed


def test_one_stop_condition_replaces_the_other():
    assert config_from_args(build_parser().parse_args(["run", "--duration", "5"])).stop.num_requests is None
    assert config_from_args(build_parser().parse_args(["run", "--num-prompts", "5"])).stop.duration_s is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "0"], "argument --workers: must be an integer >= 1, got '0'"),
        (["--max-lag-ms", "0"], "argument --max-lag-ms: must be a number > 0, got '0'"),
        (["--api", "grpc"], "argument --api: invalid choice: 'grpc'"),
    ],
)
def test_the_fields_range_and_choices_are_the_flags(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_help_text_keeps_its_brackets_and_its_titles_case(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "pip install 'kvbench[ray]'" in out and "'vllm-prefix[kv_cache_dtype=auto]'" in out
    assert "SLA search (real runs" in out
