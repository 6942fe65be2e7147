"""The same workload measured by three clients, side by side: kvbench, vLLM's `bench serve` and inference-perf
0.7.0, against the instrument (whose first-token time and chunk interval are injected and known, so each client's
TTFT and ITL can be read against the truth).

    python benchmarks/clients_side_by_side.py [--rate 10] [--seconds 4] [--input-len 32] [--output-len 8]
        [--vllm-python /work/main/.venv-vllm/bin/python] [--inference-perf PATH] [--out DIR]

The workload: random prompts of --input-len tokens, --output-len tokens each, Poisson arrivals at --rate
requests/s for --seconds (rate x seconds requests). kvbench and vLLM get it as `vllm bench serve` flags (the same
command line for both); inference-perf as its config (random data, fixed lengths, a Poisson stage). The table is
`kvbench report` over the three result files (a kvbench run folder, vLLM's --save-result JSON, inference-perf's
summary_lifecycle_metrics.json), written to DIR/side_by_side.md; kvbench's point is kept when its own client-lag
check marks it invalid (a shared machine; its summary.json says why). inference-perf comes from
benchmarks/inference_perf/setup_venv.sh (Python 3.12) unless --inference-perf names its executable; a client that
is not installed is left out with a line saying so. A benchmark, not a test: on a shared machine its times are
those of the load around it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from kvbench.harness.bench_loadgen import CHUNK_INTERVAL_MS, FIRST_TOKEN_MS, start_instrument

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "datasets" / "tokenizer"
VLLM_CLIENT = ROOT / "benchmarks" / "vllm_bench_client.py"
SETUP_INFERENCE_PERF = ROOT / "benchmarks" / "inference_perf" / "setup_venv.sh"


def vllm_flags(url: str, args) -> list[str]:
    """The `vllm bench serve` command line both kvbench and vLLM run."""
    return [
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "instrument",
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(round(args.rate * args.seconds)),
        "--request-rate",
        str(args.rate),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,95,99",
        "--seed",
        "0",
    ]


def inference_perf_config(url: str, out: Path, args) -> dict:
    lengths = {"input_distribution": args.input_len, "output_distribution": args.output_len}
    return {
        "load": {"type": "poisson", "stages": [{"rate": args.rate, "duration": args.seconds}]},
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": "instrument", "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(TOKENIZER)},
        "data": {
            "type": "random",
            **{key: {"min": n, "max": n, "mean": n, "std_dev": 0, "type": "fixed"} for key, n in lengths.items()},
        },
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": False}},
        "storage": {"local_storage": {"path": str(out)}},
    }


def run(command: list[str], what: str, **kwargs) -> bool:
    print(f"{what}: {' '.join(command[:3])} ...", flush=True)
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900, **kwargs)
    if done.returncode != 0:
        print(f"{what}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    return done.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--vllm-python", default=os.environ.get("KVBENCH_VLLM_PYTHON"))
    parser.add_argument("--inference-perf", help="inference-perf's executable (default: setup_venv.sh's)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="clients-")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"instrument: first token after {FIRST_TOKEN_MS} ms, a token every {CHUNK_INTERVAL_MS} ms", flush=True)
    processes, url = start_instrument()
    results = []
    try:
        run(
            [
                sys.executable,
                "-m",
                "kvbench.cli",
                "run",
                *vllm_flags(url, args),
                "--out",
                str(args.out / "kvbench"),
                "--overwrite",
            ],
            "kvbench",
        )
        if (args.out / "kvbench" / "summary.json").exists():  # kept when invalid (client lag): the table says so
            results.append(args.out / "kvbench")
        if args.vllm_python and run(
            [
                args.vllm_python,
                str(VLLM_CLIENT),
                *vllm_flags(url, args),
                "--tokenizer",
                str(TOKENIZER),
                "--disable-tqdm",
                "--save-result",
                "--result-dir",
                str(args.out),
                "--result-filename",
                "vllm.json",
            ],
            "vllm bench serve",
        ):
            results.append(args.out / "vllm.json")
        elif not args.vllm_python:
            print("vllm bench serve: left out (no --vllm-python or KVBENCH_VLLM_PYTHON)")
        executable = (
            args.inference_perf
            or subprocess.run(["bash", str(SETUP_INFERENCE_PERF)], capture_output=True, text=True)
            .stdout.strip()
            .splitlines()[-1:]
        )
        executable = executable if isinstance(executable, str) else (executable[0] if executable else "")
        if executable and Path(executable).exists():
            config = args.out / "inference-perf.yml"
            config.write_text(yaml.safe_dump(inference_perf_config(url, args.out / "inference-perf", args)))
            if run(
                [executable, "--config_file", str(config)], "inference-perf", env={**os.environ, "HF_HUB_OFFLINE": "1"}
            ):
                results.append(args.out / "inference-perf" / "summary_lifecycle_metrics.json")
        else:
            print("inference-perf: left out (benchmarks/inference_perf/setup_venv.sh found no Python 3.12)")
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
    report = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "report", *map(str, results), "--format", "md"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (args.out / "side_by_side.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
