"""Plots people can read: coinciding CDFs share one labelled curve, every throughput point is labelled, and the
eval heatmaps' colour scale spans the errors instead of starting at 0."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kvbench.evals.plots import error_scale  # noqa: E402
from kvbench.measure.report import draw_cdfs, draw_throughput_points, same_samples  # noqa: E402


def test_identical_samples_share_one_curve_labelled_with_every_name():
    a = [5.0, 1.0, 3.0]
    curves = same_samples({"lru": a, "arc": list(reversed(a)), "ours": [1.0, 3.0, 6.0], "none": []})
    assert [label for label, _ in curves] == ["lru = arc", "ours"]
    figure, axis = plt.subplots()
    draw_cdfs(axis, {"p1": a, "p2": a, "p3": a, "p4": a})
    assert [line.get_label() for line in axis.get_lines()] == ["p1 = p2 = p3 = p4"]
    plt.close(figure)


def test_curves_that_differ_get_their_own_line_styles_and_a_log_axis_when_wide():
    figure, axis = plt.subplots()
    draw_cdfs(axis, {"a": [1.0, 2.0], "b": [10.0, 400.0]})
    assert len({line.get_linestyle() for line in axis.get_lines()}) == 2 and axis.get_xscale() == "log"
    plt.close(figure)


def test_every_throughput_point_is_labelled_even_a_single_one():
    frame = pd.DataFrame(
        {
            "engine": ["fp32", "fp8", "fp8"],
            "workload": ["w"] * 3,
            "load": ["conc=4", "rps=1", "rps=2"],
            "output_tok_s": [3.9, 2.0, 5.9],
            "ttft_p99_ms": [40624.5, 900.0, 1500.0],
        }
    )
    figure, axis = plt.subplots()
    draw_throughput_points(axis, frame)
    assert sorted(text.get_text() for text in axis.texts) == ["fp32 conc=4", "rps=1", "rps=2"]
    plt.close(figure)


def test_the_layer_heatmap_scale_spans_the_errors():
    close = error_scale({"fp8 K": np.array([[0.050, 0.052], [0.055, 0.060]])})
    assert (close.vmin, close.vmax) == (0.050, 0.060)  # not 0..0.06, where every cell is the same colour
    wide = error_scale({"fp8 K": np.array([[0.001, 0.5]]), "fp8 V": np.array([[0.02, np.nan]])})
    assert type(wide).__name__ == "LogNorm" and (wide.vmin, wide.vmax) == (0.001, 0.5)
