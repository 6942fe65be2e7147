#!/usr/bin/env bash
# The prepared device check of our engine: one command, under 8 minutes, no network, no install.
#
#   ci/gpu-check.sh [--device cpu] [--quick] [--cuda-graphs]     (any flag of benchmarks/gpu_check.py)
#
# 1. benchmarks/gpu_check.py prints one table: per model (SmolLM2-135M; a random-weight Llama-3-8B-shaped
#    model) and KV format (bf16, fp8_e4m3, fp8_e5m2): attention backend and its error against the reference,
#    bytes per token, prefill tok/s, decode ITL at batch 1/8/64 and decode tok/s; then codec GB/s next to a
#    device copy.
# 2. the gpu-marked tests (they skip without CUDA), plus the Triton kernel's test.
#
# Runs from the working tree (PYTHONPATH); needs torch, numpy, safetensors, transformers. What the lent
# machine lacks travels in .gpu-carry/ (git-ignored; made by ci/gpu-carry.sh here): pytest and gguf under
# .gpu-carry/site, and SmolLM2's GGUF (98 MB, more than one run may carry) in two parts carried by two calls
# in a row (see ci/gpu-carry.sh). Without the GGUF the SmolLM2 rows use its shapes with random weights and
# say so. `--device cpu --quick` checks the script itself on a CPU in about a minute.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=.gpu-carry
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$carry/site" ] && export PYTHONPATH="$PYTHONPATH:$PWD/$carry/site"
export KVBENCH_CACHE_DIR="${KVBENCH_CACHE_DIR:-$PWD/$carry/models}"
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python=${PYTHON:-python3}

model_args=()
gguf="$carry/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ] && [ -f "$carry/smollm2.part1" ] && [ -f "$carry/smollm2.part2" ]; then
    cat "$carry/smollm2.part1" "$carry/smollm2.part2" > "$gguf.tmp" && mv "$gguf.tmp" "$gguf"
fi
if [ -f "$gguf" ]; then
    if [ -n "${SMOLLM2_SHA256:-}" ] && ! echo "$SMOLLM2_SHA256  $gguf" | sha256sum -c --quiet; then
        echo "gpu-check: $gguf does not match SMOLLM2_SHA256; ignoring it" >&2
    else
        model_args=(--model "$gguf")
    fi
fi

status=0
timeout 420 "$python" benchmarks/gpu_check.py "${model_args[@]}" "$@" || status=$?
[ $status -eq 124 ] && echo "gpu-check: the table ran past 420 s" >&2

if "$python" -c "import pytest" 2>/dev/null; then
    timeout 120 "$python" -m pytest -o addopts="" -q -rs -p no:cacheprovider tests/engines/kvengine/model/test_model_gpu.py \
        || status=$?
else
    echo "gpu-check: pytest is not importable (run ci/gpu-carry.sh here and carry $carry/site); gpu tests not run" >&2
    status=1
fi
exit $status
