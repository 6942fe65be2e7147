#!/usr/bin/env bash
# inference-perf 0.7.0 in its own venv: it needs Python >= 3.12 (kvbench's venv is 3.11), and its pins are its own.
# Usage: bash benchmarks/inference_perf/setup_venv.sh [VENV_DIR]   (default ~/.cache/kvbench/inference-perf-venv)
# Python 3.12 from $INFERENCE_PERF_PYTHON, else python3.12 on PATH, else pyenv's newest 3.12.
set -euo pipefail
venv="${1:-${KVBENCH_CACHE_DIR:-$HOME/.cache/kvbench}/inference-perf-venv}"
python="${INFERENCE_PERF_PYTHON:-}"
if [ -z "$python" ]; then
  python="$(command -v python3.12 || true)"
fi
if [ -z "$python" ] && [ -d "${PYENV_ROOT:-$HOME/.pyenv}/versions" ]; then
  python="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python 2>/dev/null | sort -V | tail -1 || true)"
fi
if [ -z "$python" ]; then
  echo "error: inference-perf needs Python >= 3.12; set INFERENCE_PERF_PYTHON=/path/to/python3.12" >&2
  exit 2
fi
if [ ! -x "$venv/bin/inference-perf" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet "inference-perf==0.7.0"
fi
echo "$venv/bin/inference-perf"
