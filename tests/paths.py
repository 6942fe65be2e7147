"""Where the tests find the project's shared material: ../shared beside the checkout (as in CI)."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KVBENCH_SHARED_DIR", REPO.parent / "shared"))
TRACES = SHARED / "traces"
REFERENCE = SHARED / "reference"
MOONCAKE = TRACES / "mooncake" / "synthetic_trace.jsonl"
