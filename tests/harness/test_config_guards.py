"""Config size guards: a YAML alias bomb and a sweep of a million cells are refused with one line, exit 2,
before anything is expanded; each in a child process under a memory and CPU limit, its memory growth measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.harness.config import parse_config
from kvbench.settings import SettingsError

# The child: imports first (their memory is not the refusal's), then a cap on address space and CPU so that an
# unguarded expansion fails here fast instead of filling the machine; prints the exit code and the peak growth.
CHILD = r"""
import json, resource, sys
from kvbench.cli.main import main
import kvbench.cli.commands.run_cmd, kvbench.harness.dry_run  # noqa: F401 - imported before the limits
def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + 512 * 2**20,) * 2)
resource.setrlimit(resource.RLIMIT_CPU, (30, 30))
try:
    code = main(["run", sys.argv[1], "--dry-run", "--out", sys.argv[2]])
except MemoryError:
    code = "MemoryError"
growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"code": code, "growth_mb": growth_mb}))
"""

BOMB = """\
engines: [{engine: endpoint, settings: {url: "http://127.0.0.1:1"}}]
workloads:
  - name: rag-chat-mini
    overrides:
      a: &a [x, x, x, x, x, x, x, x, x]
      b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
      c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
      d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
      e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
      f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
      g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
      h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
      i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""
VALUES = ", ".join(str(value) for value in range(100))
HUGE_SWEEP = f"""\
engines:
  - engine: endpoint
    settings: {{url: "http://127.0.0.1:1"}}
    sweep: {{max_tokens: [{VALUES}], temperature: [{VALUES}], top_p: [{VALUES}]}}
loads: [{{concurrency: 1}}]
"""


def _refused(tmp_path: Path, text: str) -> tuple[dict, str]:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(config), str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, f"the child died ({child.returncode}): {child.stderr[-2000:]}"
    return json.loads(child.stdout.strip().splitlines()[-1]), child.stderr.strip()


def test_an_alias_bomb_in_workload_overrides_is_refused_in_one_line_without_expanding(tmp_path):
    result, err = _refused(tmp_path, BOMB)
    assert result["code"] == 2, (result, err[-500:])
    assert result["growth_mb"] < 100, result
    assert "\n" not in err and "expands to more than 100,000 values" in err and "config.yaml" in err
    assert not (tmp_path / "out").exists()


def test_a_sweep_of_a_million_cells_is_refused_with_its_count_and_largest_factors(tmp_path):
    result, err = _refused(tmp_path, HUGE_SWEEP)
    assert result["code"] == 2, (result, err[-500:])
    assert result["growth_mb"] < 100, result
    assert "\n" not in err and "1,000,000 cells" in err and "more than 10,000" in err
    assert "engines[0].sweep.max_tokens 100" in err and "engines[0].sweep.top_p 100" in err


@pytest.mark.parametrize(
    ("loads", "repeat", "named"), [(200, 60, "loads 200, repeat 60"), (101, 100, "loads 101, repeat 100")]
)
def test_loads_and_repetitions_count_too(loads, repeat, named):
    data = {
        "engines": [{"engine": "endpoint"}],
        "loads": [{"concurrency": 1 + i} for i in range(loads)],
        "repeat": repeat,
    }
    with pytest.raises(SettingsError, match=f"{loads * repeat:,} cells.*{named}"):
        parse_config(data)
    data["repeat"] = 10_000 // loads
    assert len(parse_config(data).loads) == loads  # up to the bound, a matrix still parses
