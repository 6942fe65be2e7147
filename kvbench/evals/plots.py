"""The eval's figures (matplotlib, Agg): they draw rows computed elsewhere and compute nothing themselves."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def _figure(path: Path, panels: int, title: str, width: float = 4.2, tight: bool = True):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, panels, figsize=(width * panels, 3.8), squeeze=False)
    try:
        yield figure, axes[0]
        figure.suptitle(title)
        if tight:
            figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)


def position_plot(rows: Sequence, path: Path) -> None:
    """KL, top-1 agreement and perplexity change (each with its 95% interval) per context-position bucket,
    one line per setting, from MetricRows whose source is "pos LOW-HIGH"."""
    panels = (
        ("kl", "KL (nats)", "value"),
        ("top1_agreement", "top-1 agreement delta %", "delta_pct"),
        ("perplexity", "perplexity change % (neg = worse)", "delta_pct"),
    )
    settings = list(dict.fromkeys(row.setting for row in rows))
    with _figure(path, len(panels), "Quality by context position (95% paired bootstrap intervals)") as (_, axes):
        for axis, (name, label, kind) in zip(axes, panels):
            for setting in settings:
                mine = [r for r in rows if r.setting == setting and r.name == name]
                if not mine:
                    continue
                mids = np.array([_mid(r.source) for r in mine])
                value = np.array([(r.value if kind == "value" else r.delta_pct) or 0.0 for r in mine])
                low = np.array([r.ci_low if r.ci_low is not None else np.nan for r in mine])
                high = np.array([r.ci_high if r.ci_high is not None else np.nan for r in mine])
                axis.errorbar(
                    mids,
                    value,
                    yerr=[np.abs(value - low), np.abs(high - value)],
                    marker="o",
                    ms=3,
                    capsize=2,
                    label=setting,
                )
            axis.set_xscale("log", base=2)
            axis.set_xlabel("context position (tokens seen)")
            axis.set_ylabel(label)
            axis.grid(alpha=0.3)
        axes[0].legend(fontsize=7)


def _mid(source: str) -> float:
    low, high = (int(part) for part in source.split(" ", 1)[1].split("-"))
    return max((low + high) / 2.0, 1.0)


def layer_plot(errors: dict[str, np.ndarray], path: Path, title: str) -> None:
    """Heatmaps of relative quantisation error [layer, kv head], one per (setting, K or V) in `errors`."""
    names = list(errors)
    with _figure(path, len(names), title, width=2.6, tight=False) as (figure, axes):  # a shared colorbar
        norm = error_scale(errors)
        for axis, name in zip(axes, names):
            image = axis.imshow(errors[name], aspect="auto", cmap="viridis", norm=norm)
            axis.set_title(name, fontsize=8)
            axis.set_xlabel("kv head")
            axis.set_ylabel("layer")
        figure.colorbar(image, ax=list(axes), fraction=0.02)


def error_scale(errors: dict[str, np.ndarray]):
    """The heatmaps' shared colour scale: from the smallest error to the largest (not from 0, where errors of
    0.05-0.06 would all be the same colour), logarithmic when they span more than 10x."""
    from matplotlib.colors import LogNorm, Normalize

    values = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in errors.values()])
    values = values[np.isfinite(values)]
    if not values.size:
        return Normalize(0.0, 1.0)
    low, high = float(values.min()), float(values.max())
    positive = values[values > 0]
    if positive.size and high > 10 * float(positive.min()):
        return LogNorm(float(positive.min()), high)
    return Normalize(low, high if high > low else low + 1e-12)


def tradeoff_plot(points: Sequence[dict], path: Path) -> None:
    """Quality loss (perplexity change %, with its interval) against throughput, one point per setting."""
    with _figure(path, 1, "Quality vs throughput per KV setting", width=6.5) as (_, axes):
        axis = axes[0]
        for point in points:
            x, y = point.get("output_tok_s"), point.get("perplexity_delta_pct")
            if x is None or y is None:
                continue
            low, high = point.get("perplexity_ci_low"), point.get("perplexity_ci_high")
            yerr = None if low is None else [[abs(y - low)], [abs(high - y)]]
            axis.errorbar([x], [y], yerr=yerr, marker="o", capsize=3, label=point["kv_setting"])
        axis.set_xlabel("output tokens/s (kvbench run)")
        axis.set_ylabel("perplexity change % (neg = worse)")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
