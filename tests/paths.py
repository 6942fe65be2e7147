"""Where the tests find the project's shared material (public traces, real engines' help texts and /metrics
dumps): `tests/data/shared/`, copies of ../shared/{traces,reference} kept in the repo so that a clone tests
anywhere, on a fresh machine, with nothing beside it. KVBENCH_SHARED_DIR points elsewhere (e.g. ../shared)."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KVBENCH_SHARED_DIR", REPO / "tests" / "data" / "shared"))
TRACES = SHARED / "traces"
REFERENCE = SHARED / "reference"
MOONCAKE = TRACES / "mooncake" / "synthetic_trace.jsonl"
