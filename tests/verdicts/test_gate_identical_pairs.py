"""The power benchmark's false-alarm side (benchmarks/gate_power.py) as a test: two identical instruments, each its
own process on its own port, measured by `kvbench run` at the nightly's workload and load, one after the other
twice (alternated), and every pair of runs judged by `kvbench compare` (its seed fixed): no metric is ever a
regression. A run the client's own lag check voids (at 50 ms: the machine stalled for seconds, as one run did
under load 15, TTFT p99 x40) is run again. A third instrument with a 5x TTFT must be called a regression, so
the test can fail (on a machine this busy the client's own delay hides a 30% one)."""

from __future__ import annotations

import itertools

import pytest
import yaml

from kvbench.cli.main import main
from kvbench.measure.run_folder import read_run_folder
from kvbench.verdicts.compare import CompareOptions, compare
from kvbench.verdicts.gate_metrics import DEFAULT_METRICS
from kvbench.verdicts.verdict import Verdict

from ..harness.instrument_fixture import instrument_process

pytestmark = pytest.mark.slow
LAG_MS = 50  # a busy machine's usual lag (16-19 ms p99 under load 15) passes; a stall of seconds does not
ATTEMPTS = 3
METRICS = tuple(name for name in DEFAULT_METRICS if name not in ("cache_hit_rate", "prefill_recompute_rate"))


def _run(tmp_path, url: str, name: str):
    """A nightly-size run; one the client's own lag check voids (the machine stalled, not the server) is run
    again, up to ATTEMPTS times, since a stall of seconds moves a whole run and no gate can tell it apart."""
    config = {
        "name": "identical-pairs",
        "seed": 0,
        "repeat": 2,
        "engines": [{"engine": "endpoint", "label": "instrument", "settings": {"url": url}}],
        "workloads": [{"name": "rag-chat-mini", "num_sessions": 8}],  # the nightly's (ci/nightly-cpu.yaml)
        "loads": [{"concurrency": 4}],
        "stop": {"warmup_requests": 0},
        "client": {"max_lag_ms": LAG_MS},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    for _ in range(ATTEMPTS):
        code = main(["run", str(path), "--out", str(tmp_path / name), "--overwrite", "--progress-every", "600"])
        folder = read_run_folder(tmp_path / name)
        reasons = [reason for entry in folder.entries for reason in entry.invalid_reasons]
        if code == 0:
            return folder
        assert reasons and all(reason.startswith("client lag") for reason in reasons), reasons
    pytest.skip(f"the client's lag check voided {name} {ATTEMPTS} times: this machine cannot measure now")


def test_identical_instrument_pairs_are_never_a_regression_and_a_five_times_slower_one_is(tmp_path):
    flags = ("--first-token-ms", "40", "--chunk-interval-ms", "10")
    with (
        instrument_process(*flags) as (first, _),
        instrument_process(*flags) as (twin, _),
        instrument_process("--first-token-ms", "200", "--chunk-interval-ms", "10") as (slower, _),
    ):
        runs = {"a": [], "b": [], "slow": []}
        for round_ in range(2):
            for name, url in (("a", first), ("b", twin), ("slow", slower))[:: 1 if round_ == 0 else -1]:
                runs[name].append(_run(tmp_path, url, f"{name}{round_}"))
    options = CompareOptions(metrics=METRICS, seed=0)
    for base, new in itertools.permutations(runs["a"] + runs["b"], 2):  # both orders: no improvement either
        comparison = compare(base, new, options)
        assert not comparison.regressions, [(r.metric, r.delta, r.ci_low, r.ci_high) for r in comparison.regressions]
    for base, new in itertools.product(runs["a"], runs["slow"]):
        ttft = next(row for row in compare(base, new, options).rows if row.metric == "ttft_p50")
        assert ttft.verdict is Verdict.REGRESSION, (ttft.delta, ttft.ci_low, ttft.ci_high)
