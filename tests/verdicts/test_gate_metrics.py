"""The gate's per-request samples are metrics.py's own per-request values, on the records of real runs."""

from pathlib import Path

import numpy as np
import pytest

from kvbench.measure import metrics
from kvbench.measure.run_folder import records_by_run
from kvbench.verdicts.gate_metrics import PERF_METRICS, RequestSamples

RESULTS = Path(__file__).resolve().parents[2] / "results"
REAL_RUNS = [RESULTS / "baselines" / "nightly-cpu", RESULTS / "sim" / "validation" / "validation-run"]


def column(values):
    return np.array([np.nan if value is None else value for value in values], dtype=np.float64)


@pytest.mark.parametrize("run_dir", REAL_RUNS, ids=lambda path: path.name)
def test_request_samples_are_the_per_request_metrics_of_a_real_run(run_dir):
    runs = records_by_run(run_dir)
    assert len(runs) >= 3
    for run_id, records in runs.items():
        ok = metrics.completed(records)
        samples = RequestSamples.of(records)
        assert samples.size == len(ok) > 0, run_id
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            np.testing.assert_array_equal(getattr(samples, name), column(getattr(metrics, name)(r) for r in ok))
        np.testing.assert_array_equal(samples.itl_ms, [gap for r in ok for gap in metrics.itl_ms(r)])
        np.testing.assert_array_equal(samples.total_tokens, [metrics.total_token_count(r) for r in ok])
        np.testing.assert_array_equal(samples.recomputed_tokens, column(metrics.recomputed_tokens(r) for r in ok))
        overall = metrics.summarize(records)
        assert samples.span_s.sum() == pytest.approx(overall.duration_s, rel=1e-12)


@pytest.mark.parametrize("run_dir", REAL_RUNS, ids=lambda path: path.name)
def test_without_resampling_every_gate_metric_is_the_summary_value_of_a_real_run(run_dir):
    for run_id, records in records_by_run(run_dir).items():
        overall = metrics.summarize_run(records).to_dict()["overall"]
        samples = RequestSamples.of(records)
        identity = np.ones((1, samples.size), dtype=np.int32)
        for name, metric in PERF_METRICS.items():
            stored, resampled = metric.stored(overall), metric.statistic(samples, identity)[0]
            if stored is None:
                assert np.isnan(resampled), (run_id, name)
            else:
                assert resampled == pytest.approx(stored, rel=1e-9), (run_id, name)
