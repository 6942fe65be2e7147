"""The published-vs-simulated comparison as Markdown and JSON, and the accuracy targets checked on it.

Targets (issue 27), on the rows of both routers:
    output tok/s     within +-20 % of published at every stage
    RR TTFT onset    the first round-robin stage with TTFT mean > 10 s within one ladder step of the published one
    precise TTFT     precise-prefix TTFT mean within 2x (ratio in [0.5, 2]) at every stage
    ITL mean         within +-25 % of the published whole-ladder mean
A fit's own values (`Fit.fitted_rows`) are residuals, not checks: they are marked in the tables and left out of
the per-stage targets (the whole-ladder ITL has no per-stage split, so it covers fitted stages too).
Over several seeds (`published.across_seeds`) the rows carry the median across seeds, so the targets are judged on
the medians; the tables print each median with the seeds' min-max range beside it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.sim.presets import ROUTE_PRECISE_PREFIX, ROUTE_ROUND_ROBIN
from kvbench.sim.published import (
    STAGE_METRICS,
    WHOLE,
    EffectRow,
    Row,
    SeedSpread,
    comparison_doc,
    first_rate_above,
)

TTFT_ONSET_S = 10.0


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    met: bool | None  # None: the case does not publish what it needs
    detail: str


def fmt_value(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    if metric.endswith("_tok_s"):
        return f"{value:,.0f}"
    if metric == "request_s" or metric.endswith("hit_rate"):
        return f"{value:.3g}"
    if metric == "itl_mean_ms":
        return f"{value:.1f}"
    return f"{value:.3f}"


def fmt_ratio(row: Row | None, fitted: Collection[str] = ()) -> str:
    if row is None or row.ratio is None:
        return "-"
    return f"{row.ratio:.2f}" + (" (fit)" if row.key in fitted else "")


def fmt_simulated(row: Row | None, spreads: Mapping[str, SeedSpread] | None = None) -> str:
    """The simulated value, and where `spreads` has the row (several seeds), the seeds' range: `0.504 (0.3-1.0)`."""
    if row is None:
        return "-"
    spread = spreads.get(row.key) if spreads else None
    if spread is None or spread.low is None:
        return fmt_value(row.simulated, row.metric)
    return (
        f"{fmt_value(row.simulated, row.metric)} ({fmt_value(spread.low, row.metric)}-"
        f"{fmt_value(spread.high, row.metric)})"
    )


def markdown_table(
    rows: Sequence[Row], route: str, fitted: Collection[str] = (), spreads: Mapping[str, SeedSpread] | None = None
) -> list[str]:
    """One router's stages: published, simulated and ratio for each compared metric (fitted ones marked; with
    `spreads`, by `Row.key`, the simulated value is the seeds' median and their range is printed beside it)."""
    by = {(r.stage, r.metric): r for r in rows if r.arm == route}
    stages = list(dict.fromkeys(r.stage for r in rows if r.arm == route and r.stage != WHOLE))
    head = ["rate"] + [f"{m} {part}" for m in STAGE_METRICS for part in ("pub", "sim", "ratio")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for stage in stages:
        cells = [stage]
        for metric in STAGE_METRICS:
            row = by.get((stage, metric))
            cells += [fmt_value(row and row.published, metric), fmt_simulated(row, spreads), fmt_ratio(row, fitted)]
        lines.append("| " + " | ".join(cells) + " |")
    whole = [r for r in rows if r.arm == route and r.stage == WHOLE]
    if whole:
        lines.append("")
        lines.append(
            "whole ladder: "
            + "; ".join(
                f"{r.metric} {fmt_value(r.published, r.metric)} published, "
                f"{fmt_simulated(r, spreads)} simulated ({fmt_ratio(r)})"
                for r in whole
            )
        )
    return lines


def check_targets(rows: Sequence[Row], stages: Sequence[str], fitted: Collection[str] = ()) -> list[Target]:
    """The four targets of the module docstring on `rows` but the `fitted` ones (`stages`: the ladder's rates, in
    order)."""
    targets = []
    rows = [r for r in rows if r.key not in fitted]
    out = [r for r in rows if r.metric == "output_tok_s" and r.stage != WHOLE and r.ratio is not None]
    worst = max(out, key=lambda r: abs(r.ratio - 1), default=None)
    targets.append(
        Target(
            "output tok/s within +-20% at every stage",
            None if worst is None else all(0.8 <= r.ratio <= 1.2 for r in out),
            "-" if worst is None else f"worst {worst.arm} {worst.stage}/s: {worst.ratio:.2f}",
        )
    )
    published = first_rate_above(rows, ROUTE_ROUND_ROBIN, "ttft_mean_s", TTFT_ONSET_S, simulated=False)
    simulated = first_rate_above(rows, ROUTE_ROUND_ROBIN, "ttft_mean_s", TTFT_ONSET_S, simulated=True)
    if published is None:
        targets.append(Target("round-robin TTFT mean > 10 s onset within one step", None, "not published"))
    else:
        rates = [float(s) for s in stages]
        steps = None if simulated is None else abs(rates.index(simulated) - rates.index(published))
        targets.append(
            Target(
                "round-robin TTFT mean > 10 s onset within one step",
                steps is not None and steps <= 1,
                f"published {published:g}/s, simulated {'never' if simulated is None else f'{simulated:g}/s'}",
            )
        )
    precise = [
        r
        for r in rows
        if r.arm == ROUTE_PRECISE_PREFIX and r.metric == "ttft_mean_s" and r.stage != WHOLE and r.ratio is not None
    ]
    off = [r for r in precise if not 0.5 <= r.ratio <= 2.0]
    targets.append(
        Target(
            "precise TTFT mean within 2x at every stage",
            None if not precise else not off,
            ", ".join(f"{r.stage}/s {r.ratio:.2f}" for r in off)
            or ("all within" if precise else "no precise-prefix rows"),
        )
    )
    itl = [r for r in rows if r.metric == "itl_mean_ms" and r.ratio is not None]
    targets.append(
        Target(
            "ITL mean within +-25%",
            None if not itl else all(0.75 <= r.ratio <= 1.25 for r in itl),
            ", ".join(f"{r.arm} {r.ratio:.2f}" for r in itl) or "not published",
        )
    )
    return targets


def effect_lines(effects: Sequence[EffectRow]) -> list[str]:
    """The effects as a Markdown table: published and simulated change, same direction, size ratio."""
    if not effects:
        return []

    def pct(v):
        return "-" if v is None else f"{v * 100:+.1f}%"

    lines = [
        "| arm | over | stage | metric | published | simulated | same direction | simulated / published |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in effects:
        size = "-" if e.size_ratio is None else f"{e.size_ratio:.2f}"
        same = "-" if e.same_direction is None else "yes" if e.same_direction else "no"
        lines.append(
            f"| {e.arm} | {e.over} | {e.stage} | {e.metric} | {pct(e.published_change)} | {pct(e.simulated_change)} | "
            f"{same} | {size} |"
        )
    return lines


def write_comparison(
    out_dir: Path,
    case_name: str,
    rows: Sequence[Row],
    targets: Sequence[Target],
    header: Sequence[str],
    fitted: Collection[str] = (),
    spreads: Sequence[SeedSpread] = (),
    seeds: Sequence[int] = (),
    effects: Sequence[EffectRow] = (),
    extra: Mapping[str, object] | None = None,
) -> list[Path]:
    """`comparison.md` (a table per arm, the effects, the targets) and `comparison.json` under `out_dir`
    (`fitted`: the `Row.key`s a fit was made on, marked; `spreads`: over several `seeds`, the rows' ranges and
    per-seed values; `arms`/`stages`/`effects` as `published.comparison_doc`; `extra`: more top-level keys of
    the JSON, the simulation's wall time per arm, say)."""
    by_key = {s.row.key: s for s in spreads}
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# {case_name}: published vs simulated", "", *header, ""]
    for route in dict.fromkeys(r.arm for r in rows):
        lines += [f"## {route}", "", *markdown_table(rows, route, fitted, by_key), ""]
    if effects:
        lines += ["## effects", "", *effect_lines(effects), ""]
    lines += ["## targets", ""]
    if fitted:
        lines += ["On the values not fitted (the ratios marked (fit) are the fit's residuals).", ""]
    lines += [f"- {'met' if t.met else 'not met' if t.met is False else 'n/a'}: {t.name} ({t.detail})" for t in targets]
    md, js = out_dir / "comparison.md", out_dir / "comparison.json"
    md.write_text("\n".join(lines) + "\n")

    def spread_fields(r):
        return (
            {}
            if r.key not in by_key
            else {"low": by_key[r.key].low, "high": by_key[r.key].high, "per_seed": list(by_key[r.key].per_seed)}
        )

    js.write_text(
        json.dumps(
            {
                "case": case_name,
                "header": list(header),
                **({"seeds": list(seeds)} if seeds else {}),
                **comparison_doc(rows, effects),
                "rows": [
                    {
                        "arm": r.arm,
                        "stage": r.stage,
                        "metric": r.metric,
                        "published": r.published,
                        "simulated": r.simulated,
                        "ratio": r.ratio,
                        "fitted": r.key in fitted,
                    }
                    | spread_fields(r)
                    for r in rows
                ],
                "targets": [{"name": t.name, "met": t.met, "detail": t.detail} for t in targets],
                **(extra or {}),
            },
            indent=1,
        )
    )
    return [md, js]
