"""Prometheus text parsed with prometheus-client's own parser, flattened for before/after deltas."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{key}="{labels[key]}"' for key in sorted(labels))
    return f"{name}{{{inner}}}"


class NotPrometheusText(ValueError):
    """A /metrics body that is not the Prometheus text format (a proxy's HTML page, `{}`, ...)."""


def parse_samples(text: str) -> dict[str, float]:
    """Every sample of an exposition as {'name{labels}': value} (counters keep their `_total` suffix).

    Raises NotPrometheusText, naming how the body starts, when it is not Prometheus text.
    """
    samples: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample_key(sample.name, sample.labels)] = float(sample.value)
    except ValueError as exc:
        detail = f" ({exc})" if str(exc) else ""
        raise NotPrometheusText(f"not Prometheus text{detail}; the body starts {text[:60]!r}") from None
    return samples


def counter_deltas(
    before: Mapping[str, float], after: Mapping[str, float], prefixes: tuple[str, ...]
) -> dict[str, float]:
    """after - before for the `_total` samples whose names start with one of `prefixes`.

    A counter present only after the run counts from zero (it was created during the run).
    """
    deltas: dict[str, float] = {}
    for key, value in after.items():
        name = key.split("{", 1)[0]
        if name.endswith("_total") and name.startswith(prefixes):
            deltas[key] = value - before.get(key, 0.0)
    return deltas


def sum_samples(samples: Mapping[str, float], name: str, **labels: str) -> float | None:
    """Sum of the samples of metric `name` whose labels include `labels`; None if there are none."""
    total = None
    for key, value in samples.items():
        sample_name, _, rest = key.partition("{")
        if sample_name != name:
            continue
        if all(f'{label}="{wanted}"' in rest for label, wanted in labels.items()):
            total = (total or 0.0) + value
    return total
