"""Our engine vs vLLM (prefix caching) on this CPU: same model, same rag-chat-mini sessions, working set ~4x KV.

    python benchmarks/engines_cpu_compare.py [--kv-tokens 4096] [--ratio 4] [--concurrency 2]
        [--vllm-python /work/vllm-venv/bin/python] [--out runs/engines-cpu]

Both engines get the same device KV capacity in tokens (kvengine: `kv_capacity`; vLLM: `--kv-cache-memory-bytes`
= tokens x bytes per token of the model's fp32 KV), and the number of sessions is chosen so that the workload's
working set (every session's context, user turns and answers, the shared system prompt counted once) is about
`ratio` times that capacity. Each engine runs once through `kvbench run`; the table shows TTFT p50/p99, output
throughput, cache hit rate, the oracle hit rate (an unbounded cache), prefill recomputation and whether the
per-request cached tokens reconciled with the server's counter.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kvbench.cli.main import main as kvbench_main  # noqa: E402
from kvbench.measure.run_folder import SUMMARY_JSON, read_entries  # noqa: E402
from kvbench.workloads.profiles import PROFILES, load_workload  # noqa: E402

WORKLOAD = "rag-chat-mini"


def kv_bytes_per_token(model_folder: Path, dtype_bytes: int = 4) -> int:
    config = json.loads((model_folder / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * dtype_bytes


def working_set_tokens(num_sessions: int, seed: int) -> int:
    workload = load_workload(WORKLOAD, seed=seed, num_sessions=num_sessions)
    system = PROFILES[WORKLOAD].system_tokens
    total = sum(len(s.context) + sum(len(t.user_tokens) + t.max_tokens for t in s.turns) for s in workload.sessions)
    return total - system * (len(workload.sessions) - 1)


def sessions_for(target_tokens: int, seed: int) -> int:
    sessions = 1
    while working_set_tokens(sessions, seed) < target_tokens:
        sessions += 1
    return sessions


def run_engine(engine: str, settings: dict[str, object], sessions: int, requests: int, args, out: Path) -> dict:
    flags = [part for key, value in settings.items() for part in ("--set", f"{key}={value}")]
    started = time.perf_counter()
    code = kvbench_main(["run", "--engine", engine, *flags, "--workload", WORKLOAD, "--num-sessions", str(sessions),
                         "--num-requests", str(requests), "--concurrency", str(args.concurrency),
                         "--seed", str(args.seed), "--out", str(out)])
    wall = time.perf_counter() - started
    entries = read_entries(out) if (out / SUMMARY_JSON).exists() else []
    if not entries:
        return {"engine": engine, "error": f"exit {code}, no summary (see {out})", "wall_s": wall}
    entry = entries[0].to_json()
    return {"engine": engine, "entry": entry, "wall_s": wall, "code": code}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-tokens", type=int, default=4096, help="device KV capacity of each engine, in tokens")
    parser.add_argument("--ratio", type=float, default=4.0, help="working set / KV capacity")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-python", default=os.environ.get("KVBENCH_VLLM_PYTHON", "/work/vllm-venv/bin/python"))
    parser.add_argument("--engines", default="kvengine,vllm", help="comma-separated subset to run")
    parser.add_argument("--out", type=Path, default=Path("runs") / f"engines-cpu-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args()

    from kvbench.engines.kvengine.model.weights import resolve_source

    model = resolve_source("default")
    per_token = kv_bytes_per_token(model)
    sessions = sessions_for(int(args.ratio * args.kv_tokens), args.seed)
    working_set = working_set_tokens(sessions, args.seed)
    requests = load_workload(WORKLOAD, seed=args.seed, num_sessions=sessions).num_requests
    engines = {
        "kvengine": {"model": "default", "kv_capacity": args.kv_tokens, "threads": 2},
        "vllm": {"python": args.vllm_python, "model": str(model), "dtype": "float32", "enforce_eager": "true",
                 "max_model_len": min(4096, args.kv_tokens - 256),  # vLLM holds one page back
                 "kv_cache_memory_bytes": args.kv_tokens * per_token},
    }
    _register_vllm_until_installed()
    chosen = [name.strip() for name in args.engines.split(",")]
    results = [run_engine(name, engines[name], sessions, requests, args, args.out / name) for name in chosen]

    title = (f"{WORKLOAD}: {sessions} sessions, {requests} requests, working set ~{working_set} tokens = "
             f"{working_set / args.kv_tokens:.1f}x the {args.kv_tokens}-token KV of each engine; SmolLM2-135M fp32, "
             f"concurrency {args.concurrency}, this CPU")
    table = Table(title=title)
    for column in ("engine", "requests", "errors", "TTFT p50 ms", "TTFT p99 ms", "output tok/s", "cache hit",
                   "oracle hit", "prefill recompute", "reconciled", "wall s"):
        table.add_column(column, justify="left" if column in ("engine", "reconciled") else "right")
    for result in results:
        if "error" in result:
            table.add_row(result["engine"], *["-"] * 8, result["error"], f"{result['wall_s']:.0f}")
            continue
        overall = result["entry"]["summary"]["overall"]
        rec = result["entry"]["reconciliation"]
        ttft, cache = overall.get("ttft_ms") or {}, overall.get("cache") or {}
        table.add_row(
            result["engine"], str(overall.get("requests")), str(overall.get("errors")),
            _num(ttft.get("p50")), _num(ttft.get("p99")), _num(overall.get("output_tok_s"), 1),
            _pct(cache.get("cache_hit_rate")), _pct(cache.get("oracle_hit_rate")),
            _pct(cache.get("prefill_recompute_rate")),
            f"{'yes' if rec['agree'] else 'NO' if rec['agree'] is False else 'n/a'} ({rec['detail']})",
            f"{result['wall_s']:.0f}",
        )
    Console(width=200).print(table)
    print(f"run folders: {args.out}/<engine>")


def _register_vllm_until_installed() -> None:
    """pyproject.toml declares the `vllm` entry point; an editable install made before it lacks it."""
    from importlib.metadata import EntryPoint

    from kvbench.engines import registry

    found = registry.available_engines()
    if "vllm" not in found:
        engines = {**found, "vllm": EntryPoint("vllm", "kvbench.engines.vllm:VLLMAdapter", "kvbench.engines")}
        registry.available_engines = lambda: engines


def _num(value, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


if __name__ == "__main__":
    main()
