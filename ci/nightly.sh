#!/usr/bin/env bash
# Nightly regression job: run ci/CONFIG_NAME.yaml, compare it with results/baselines/CONFIG_NAME.
#
#   ci/nightly.sh nightly-cpu        # or nightly-gpu
#   ci/nightly.sh nightly-gpu --cell 'kvengine[kv_dtype=bf16]' --set model=/models/Qwen2.5-72B-Instruct
#
# Arguments after CONFIG_NAME go to `kvbench run` (one cell of a matrix, settings of this machine).
# Writes runs/nightly-CONFIG_NAME-YYYYMMDD[-N]/ (the run folder, with compare.md in it) and exits with
# kvbench compare's code: 0 no regression, 1 regression or mismatch, 2 bad input (no baseline, no results).
# When compare passes but the run itself reported failures (an engine setting did not start), it exits with the
# run's code, so a crashed setting cannot pass silently.
# Environment: KVBENCH (command, default `kvbench`), NIGHTLY_RUNS (parent folder, default `runs`),
# KVBENCH_ROOT (where ci/ and results/ are, default this checkout), NIGHTLY_BASELINES (the baselines folder,
# default results/baselines: a runner keeps its own, e.g. in a CI cache, since numbers are per machine),
# NIGHTLY_BASELINE_NAME (the baseline's name, default CONFIG_NAME; one per cell when a job runs one cell).
#
# A runner's first night: with NIGHTLY_RECORD_FIRST=1 and no baseline yet, a run that itself succeeded is
# promoted to the baseline (`kvbench baseline update RUN --name CONFIG_NAME --root NIGHTLY_BASELINES`) and the
# job passes; later nights compare against it. Without it, a missing baseline exits 2 naming that command.
set -uo pipefail

name="${1:-}"
if [[ -z "$name" ]]; then
    echo "usage: ci/nightly.sh CONFIG_NAME   (runs ci/CONFIG_NAME.yaml, compares with results/baselines/CONFIG_NAME)" >&2
    exit 2
fi
shift
run_args=("$@")
# KVBENCH_ROOT: the folder holding ci/ and results/ (default: this checkout).
cd "${KVBENCH_ROOT:-$(dirname "$0")/..}"
kvbench="${KVBENCH:-kvbench}"
config="ci/${name}.yaml"
baselines="${NIGHTLY_BASELINES:-results/baselines}"
baseline_name="${NIGHTLY_BASELINE_NAME:-$name}"
baseline="${baselines}/${baseline_name}"
run_dir="${NIGHTLY_RUNS:-runs}/nightly-${baseline_name}-$(date -u +%Y%m%d)"
# A second run on the same day gets its own folder: kvbench run refuses a folder that holds a run.
first="$run_dir"
for ((n = 2; ; n++)); do
    [[ -e "$run_dir" ]] || break
    run_dir="${first}-${n}"
done
if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
    echo "run_dir=${run_dir}" >> "$GITHUB_OUTPUT"
fi
if [[ ! -f "$config" ]]; then
    echo "nightly: no ${config}" >&2
    exit 2
fi

echo "nightly: ${kvbench} run ${config} --out ${run_dir} ${run_args[*]}"
$kvbench run "$config" --out "$run_dir" "${run_args[@]}"
run_rc=$?

# The quality eval, when the config has one, writes eval.json into the same folder for compare.
eval_config="ci/${name}-eval.yaml"
if [[ -f "$eval_config" ]]; then
    echo "nightly: ${kvbench} eval ${eval_config} --out ${run_dir}"
    $kvbench eval "$eval_config" --out "$run_dir" || run_rc=$?
fi

if [[ ! -d "$baseline" ]]; then
    if [[ "${NIGHTLY_RECORD_FIRST:-0}" == 1 && $run_rc -eq 0 ]]; then
        echo "nightly: no baseline ${baseline}: this runner's first night; recording it from this run"
        $kvbench baseline update "$run_dir" --name "$baseline_name" --root "$baselines" || exit $?
        if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
            echo "recorded_baseline=${baseline}" >> "$GITHUB_OUTPUT"
        fi
        echo "nightly: recorded ${baseline}; later nights compare against it"
        exit 0
    fi
    if [[ $run_rc -ne 0 ]]; then
        echo "nightly: the run failed (exit ${run_rc}); no baseline ${baseline} recorded or compared" >&2
        exit "$run_rc"
    fi
    echo "nightly: no baseline ${baseline}; after checking the run, promote it with:" >&2
    echo "    ${kvbench} baseline update ${run_dir} --name ${baseline_name} --root ${baselines}" >&2
    exit 2
fi

echo "nightly: ${kvbench} compare ${baseline} ${run_dir} --out ${run_dir}/compare.md --strict --allow-inconclusive"
$kvbench compare "$baseline" "$run_dir" --out "${run_dir}/compare.md" --strict --allow-inconclusive
compare_rc=$?

if [[ -n "${GITHUB_STEP_SUMMARY:-}" && -f "${run_dir}/compare.md" ]]; then
    cat "${run_dir}/compare.md" >> "$GITHUB_STEP_SUMMARY"
fi
if [[ $compare_rc -ne 0 ]]; then
    exit "$compare_rc"
fi
exit "$run_rc"
