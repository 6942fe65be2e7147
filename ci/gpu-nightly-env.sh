#!/usr/bin/env bash
# The GPU nightly's per-cell environment, as KEY=VALUE lines for $GITHUB_ENV (ci/github-nightly.yml):
# the engine's interpreter from the documented venv layout, and the `kvbench run` flags of this machine's paths.
#
#   ENGINE_VENV=vllm ENGINE_VENVS=/opt/kvbench-venvs MODEL_PATH=/models/M NVME_PATH=/mnt/nvme ci/gpu-nightly-env.sh
#
# Layout: $ENGINE_VENVS/{vllm,sglang}/bin/python (vllm: vLLM with LMCache, for the vllm and lmcache cells) and
# $ENGINE_VENVS/trtllm/bin/trtllm-serve; ENGINE_VENV names the cell's engine (empty: ours, in kvbench's venv). Prints KVBENCH_VLLM_PYTHON / KVBENCH_SGLANG_PYTHON as the cell needs,
# and CELL_SETS (`--set model=...`, LMCache's `--set local_disk_path=...`, TRT-LLM's `--set executable=...`).
# A missing interpreter, or a path with whitespace, is one line on stderr and exit 2.
set -euo pipefail

venv="${ENGINE_VENV:-}"
root="${ENGINE_VENVS:-/opt/kvbench-venvs}"
model="${MODEL_PATH:-/models/Qwen2.5-72B-Instruct}"
nvme="${NVME_PATH:-/mnt/nvme}"
for value in "$root" "$model" "$nvme"; do
    if [[ "$value" =~ [[:space:]] ]]; then
        echo "gpu-nightly-env: '$value' has whitespace; use a path without it (a symlink will do)" >&2
        exit 2
    fi
done

need() {
    if [[ ! -x "$1" ]]; then
        echo "gpu-nightly-env: no $1 (ENGINE_VENV=${venv}); build it as ci/github-nightly.yml's layout says," \
             "or set KVBENCH_ENGINE_VENVS to where the engines' venvs are" >&2
        exit 2
    fi
}

sets="--set model=${model}"
case "$venv" in
    "") ;;
    vllm) need "$root/vllm/bin/python"; echo "KVBENCH_VLLM_PYTHON=$root/vllm/bin/python" ;;
    lmcache)
        need "$root/vllm/bin/python"
        echo "KVBENCH_VLLM_PYTHON=$root/vllm/bin/python"
        sets+=" --set local_disk_path=${nvme}/kvbench-lmcache"
        ;;
    sglang) need "$root/sglang/bin/python"; echo "KVBENCH_SGLANG_PYTHON=$root/sglang/bin/python" ;;
    trtllm) need "$root/trtllm/bin/trtllm-serve"; sets+=" --set executable=$root/trtllm/bin/trtllm-serve" ;;
    *) echo "gpu-nightly-env: ENGINE_VENV=${venv}: use vllm, lmcache, sglang, trtllm or empty (our engine)" >&2; exit 2 ;;
esac
echo "CELL_SETS=${sets}"
