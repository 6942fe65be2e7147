"""Combine per-router comparisons (`kvbench validate-published --router R --out DIR`) into one with the targets:
`python benchmarks/combine_published.py CASE.yaml OUT_DIR DIR1 DIR2 ...`."""

import json
import sys
from pathlib import Path

from kvbench.sim.published import Row, parse_case
from kvbench.sim.published_report import check_targets, write_comparison

case = parse_case(Path(sys.argv[1]))
out = Path(sys.argv[2])
rows, header, fitted = [], [], set()
for folder in sys.argv[3:]:
    doc = json.loads((Path(folder) / "comparison.json").read_text())
    for r in doc["rows"]:
        rows.append(Row(r.get("arm", r.get("route")), r["stage"], r["metric"], r["published"], r["simulated"]))
        if r.get("fitted"):  # values a fit was made on: marked, and left out of the targets
            fitted.add(rows[-1].key)
    header += [h for h in doc["header"] if h not in header]
targets = check_targets(rows, list(case.stage_labels), fitted)
for t in targets:
    print(("met" if t.met else "not met" if t.met is False else "n/a") + f": {t.name} ({t.detail})")
print(write_comparison(out, case.name, rows, targets, header, fitted))
