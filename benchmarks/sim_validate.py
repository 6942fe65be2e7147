"""The simulator against our real engine on this CPU: calibrate on one run, validate on another.

    python benchmarks/sim_validate.py [--out results/sim/validation]

1. a calibration run of our engine (rag-chat-mini, seed 1, concurrency 2); the engine logs every step;
2. `kvbench calibrate --steps` fits the CPU profile's efficiencies and overhead to those served steps;
3. the validation runs (benchmarks/sim_validate.yaml: seed 0, concurrency 1 and 4, open loop 0.5 sessions/s);
4. `kvbench validate-sim` replays each validation run in the simulator and prints both side by side
   (cache hit rates must be equal, TTFT p50/p99 within 25%).

Every step is an ordinary kvbench command, so any of them can be rerun alone. Takes ~5 minutes here.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from kvbench.cli.main import main as kvbench
from kvbench.engines.kvengine.adapter import STEP_LOG
from kvbench.measure.run_folder import engine_dir

HERE = Path(__file__).parent
SETTINGS = ["--set", "kv_capacity=8192", "--set", "max_num_seqs=8"]


def run(argv: list[str]) -> int:
    print("$ kvbench " + " ".join(argv), flush=True)
    return kvbench(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/sim/validation"))
    args = parser.parse_args()
    out: Path = args.out
    for name in ("calibration-run", "validation-run"):
        shutil.rmtree(out / name, ignore_errors=True)  # kvbench run appends to an existing folder
    profile = out / "cpu-calibrated.json"
    steps = [
        [
            "run",
            *SETTINGS,
            "--workload",
            "rag-chat-mini",
            "--num-sessions",
            "10",
            "--seed",
            "1",
            "--concurrency",
            "2",
            "--out",
            str(out / "calibration-run"),
        ],
        [
            "calibrate",
            "--steps",
            str(engine_dir(out / "calibration-run", "kvengine") / STEP_LOG),
            "--out",
            str(profile),
        ],
        ["run", str(HERE / "sim_validate.yaml"), "--out", str(out / "validation-run")],
    ]
    for argv in steps:
        if run(argv) != 0:
            return 1
    return run(["validate-sim", str(out / "validation-run"), "--hardware", str(profile)])


if __name__ == "__main__":
    sys.exit(main())
