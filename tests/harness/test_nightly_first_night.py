"""ci/nightly.sh on a runner's first night: with NIGHTLY_RECORD_FIRST=1 and no baseline in NIGHTLY_BASELINES, the
run is promoted and the job passes; the next night compares against it (and a regression then fails); a failed
first run records nothing. `kvbench run` is a stand-in that copies a prepared folder; the rest is the real CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.verdicts.test_compare import simple_run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_first_night_records_the_baseline_and_the_second_compares(tmp_path):
    # Quiet runs, so the verdicts resolve (a noisy pair is inconclusive, which --strict fails).
    good = simple_run(tmp_path / "fixtures" / "good", seed=1, noise=0.05)
    slow = simple_run(tmp_path / "fixtures" / "slow", seed=2, ttft_factor=1.4, noise=0.05)
    root = tmp_path / "checkout"
    (root / "ci").mkdir(parents=True)
    (root / "ci" / "nightly-cpu.yaml").write_text("engines: [kvengine]\n")
    baselines = tmp_path / "runner-cache" / "baselines"
    fake = tmp_path / "kvbench"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1" == run ]]; then mkdir -p "$(dirname "$4")" && cp -r "$FAKE_RUN" "$4"; exit "${FAKE_RC:-0}"; fi\n'
        f'exec "{sys.executable}" -c "import sys; sys.path.insert(0, \'{REPO}\'); '
        'from tests.verdicts.test_compare import cli; sys.exit(cli(sys.argv[1:]))" "$@"\n'
    )
    fake.chmod(0o755)
    outputs = tmp_path / "github_output"

    def nightly(run_folder, record_first="1", rc="0"):
        env = {
            **os.environ,
            "KVBENCH": str(fake),
            "KVBENCH_ROOT": str(root),
            "FAKE_RUN": str(run_folder),
            "NIGHTLY_BASELINES": str(baselines),
            "NIGHTLY_RECORD_FIRST": record_first,
            "FAKE_RC": rc,
            "GITHUB_OUTPUT": str(outputs),
        }
        env.pop("GITHUB_STEP_SUMMARY", None)
        return subprocess.run(
            ["bash", str(REPO / "ci" / "nightly.sh"), "nightly-cpu"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    without = nightly(good, record_first="0")
    assert without.returncode == 2 and f"--root {baselines}" in without.stderr
    crashed = nightly(good, rc="1")
    assert crashed.returncode == 1 and not baselines.exists()
    first = nightly(good)
    assert first.returncode == 0, first.stderr
    assert "first night" in first.stdout and f"recorded_baseline={baselines / 'nightly-cpu'}" in outputs.read_text()
    provenance = json.loads((baselines / "nightly-cpu" / "provenance.json").read_text())
    assert Path(provenance["source_run"]).parent == (root / "runs").resolve()
    second = nightly(good)
    assert second.returncode == 0, second.stdout[-3000:]
    assert "baseline update" not in second.stdout and "compare" in second.stdout
    assert nightly(slow).returncode == 1  # compared against the recorded baseline, the slower run regresses
