#!/usr/bin/env bash
# GPU smoke test of every engine adapter: each engine serves a small model on one GPU for about two minutes of
# rag-chat-mini load, then a short table (TTFT, throughput, cache hit rate, reconciliation) is printed.
#
#   ci/gpu-smoke.sh [OUT_DIR]
#
# Environment:
#   SMOKE_MODEL           model for every engine (default: `default`, kvbench's SmolLM2-135M as a safetensors folder;
#                         any local HF folder works -- the GPU machine may have no network)
#   SMOKE_DURATION_S      seconds of load per engine (default 120)
#   SMOKE_ENGINES         engines to try (default "kvengine vllm lmcache sglang trtllm")
#   KVBENCH_VLLM_PYTHON   interpreter with vLLM (CUDA build; LMCache installed there too for the lmcache row)
#   KVBENCH_SGLANG_PYTHON interpreter with SGLang
#   TRTLLM_SERVE          trtllm-serve executable (default: trtllm-serve on PATH)
#   KVBENCH               kvbench command (default: kvbench)
# An engine whose package is not installed is listed as "not installed" and does not fail the script; an engine
# that is installed but fails to start or serve does (exit 1).
set -uo pipefail

out="${1:-runs/gpu-smoke-$(date -u +%Y%m%d-%H%M%S)}"
model="${SMOKE_MODEL:-default}"
duration="${SMOKE_DURATION_S:-120}"
engines="${SMOKE_ENGINES:-kvengine vllm lmcache sglang trtllm}"
kvbench="${KVBENCH:-kvbench}"
vllm_python="${KVBENCH_VLLM_PYTHON:-python3}"
sglang_python="${KVBENCH_SGLANG_PYTHON:-python3}"
trtllm_serve="${TRTLLM_SERVE:-trtllm-serve}"
mkdir -p "$out"

has_module() { "$1" -c "import $2" >/dev/null 2>&1; }

status=0
for engine in $engines; do
    settings=(--set "model=${model}")
    case "$engine" in
        kvengine) settings+=(--set device=cuda --set compute_dtype=bfloat16 --set kv_dtype=bf16) ;;
        vllm)
            has_module "$vllm_python" vllm || { echo "not installed" > "$out/$engine.skipped"; continue; }
            settings+=(--set "python=${vllm_python}" --set gpu_memory_utilization=0.5 --set max_model_len=8192) ;;
        lmcache)
            has_module "$vllm_python" lmcache || { echo "not installed" > "$out/$engine.skipped"; continue; }
            settings+=(--set "python=${vllm_python}" --set gpu_memory_utilization=0.5 --set max_model_len=8192
                       --set preset=local-cpu-nvme --set max_local_cpu_size=4 --set max_local_disk_size=8) ;;
        sglang)
            has_module "$sglang_python" sglang || { echo "not installed" > "$out/$engine.skipped"; continue; }
            settings+=(--set "python=${sglang_python}" --set mem_fraction_static=0.5 --set context_length=8192) ;;
        trtllm)
            command -v "$trtllm_serve" >/dev/null 2>&1 || { echo "not installed" > "$out/$engine.skipped"; continue; }
            settings+=(--set "executable=${trtllm_serve}" --set free_gpu_memory_fraction=0.5 --set max_seq_len=8192
                       --set host_cache_gib=4) ;;
        *) echo "gpu-smoke: unknown engine $engine" >&2; status=1; continue ;;
    esac
    echo "== $engine: ${duration} s of rag-chat-mini"
    if ! timeout $((duration + 900)) $kvbench run --engine "$engine" "${settings[@]}" --workload rag-chat-mini \
            --num-sessions 200 --concurrency 4 --duration "$duration" --out "$out/$engine"; then
        echo "gpu-smoke: $engine failed (log: $out/$engine/engines/*/engine.log)" >&2
        status=1
    fi
done

python3 - "$out" $engines <<'PY'
import json, sys
from pathlib import Path

out, engines = Path(sys.argv[1]), sys.argv[2:]
print(f"\n{'engine':10} {'requests':>8} {'errors':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'out tok/s':>9} "
      f"{'hit rate':>8} {'recompute':>9}  reconciled")
for engine in engines:
    skipped, summary = out / f"{engine}.skipped", out / engine / "summary.json"
    if skipped.exists():
        print(f"{engine:10} {skipped.read_text().strip()}")
        continue
    if not summary.exists():
        print(f"{engine:10} FAILED (no summary.json)")
        continue
    run = json.loads(summary.read_text())["runs"][0]
    overall, rec = run["summary"]["overall"], run["reconciliation"]
    ttft, cache = overall.get("ttft_ms") or {}, overall.get("cache") or {}
    fmt = lambda v, f: "-" if v is None else format(v, f)
    agree = {True: "yes", False: "NO", None: "n/a"}[rec["agree"]]
    print(f"{engine:10} {overall['requests']:>8} {overall['errors']:>6} {fmt(ttft.get('p50'), '9.0f')} "
          f"{fmt(ttft.get('p99'), '9.0f')} {fmt(overall.get('output_tok_s'), '9.1f')} "
          f"{fmt(cache.get('cache_hit_rate'), '8.1%')} {fmt(cache.get('prefill_recompute_rate'), '9.1%')}  "
          f"{agree} ({rec['detail']})")
PY
exit $status
