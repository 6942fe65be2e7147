"""`kvbench plan`'s files: plan.json (every node count tried), plan.md (the answers and the points) and a
plot of each SLO metric against node count, one line per preset and KV dtype. Formats; computes nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.measure.run_folder import PLAN_JSON, PLAN_MD, PLAN_PNG
from kvbench.sim.plan import NodeSearch, SloTarget


@dataclass(frozen=True, slots=True)
class PlanLine:
    """One preset and KV dtype's search (`search` None while it runs)."""

    preset: str
    kv_dtype: str
    route: str
    search: NodeSearch


def plan_doc(lines: Sequence[PlanLine], targets: Sequence[SloTarget], settings: dict) -> dict:
    return {
        "plan": settings,
        "slo": {t.name: t.limit_ms for t in targets},
        "results": [
            {
                "preset": row.preset,
                "kv_dtype": row.kv_dtype,
                "route": row.route,
                "nodes_needed": row.search.answer,
                "unreachable": row.search.unreachable,
                "floors_ms": dict(row.search.floors),
                "points": [p.to_dict() for p in row.search.points],
                "non_monotone": list(row.search.non_monotone),
            }
            for row in lines
        ],
    }


def write_plan(
    run_dir: Path, lines: Sequence[PlanLine], targets: Sequence[SloTarget], settings: dict, plots: bool = True
) -> list[Path]:
    """Write plan.json and plan.md (and the plot); returns the files written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / PLAN_JSON).write_text(json.dumps(plan_doc(lines, targets, settings), indent=2))
    (run_dir / PLAN_MD).write_text(plan_markdown(lines, targets, settings))
    written = [run_dir / PLAN_JSON, run_dir / PLAN_MD]
    if plots and lines:
        written.append(_plot(run_dir / PLAN_PNG, lines, targets))
    return written


def answer_text(search: NodeSearch, max_nodes: int) -> str:
    if search.unreachable is not None:
        return search.unreachable
    return f"> {max_nodes} (not met)" if search.answer is None else str(search.answer)


def plan_markdown(lines: Sequence[PlanLine], targets: Sequence[SloTarget], settings: dict) -> str:
    slo = ", ".join(f"{t.name} <= {t.limit_ms:g}" for t in targets)
    out = [
        f"# kvbench plan: {settings.get('workload')} on {settings.get('hardware')} nodes, {settings.get('model')}",
        "",
        f"SLO: {slo}. {settings.get('assumptions', '')}",
        "",
        "| preset | KV | routing | nodes needed |",
        "|---|---|---|---:|",
    ]
    for row in lines:
        out.append(
            f"| {row.preset} | {row.kv_dtype} | {row.route} | {answer_text(row.search, settings.get('max_nodes', 0))} |"
        )
    out += [
        "",
        "Every node count tried (cost: simulated serving time, node-hours and device-hours it took):",
        "",
        "| preset | KV | nodes | "
        + " | ".join(t.name for t in targets)
        + " | meets | errors | out tok/s | served s | node-h | device-h | sim wall s |",
        "|---|---|---:|" + "---:|" * len(targets) + "---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in lines:
        for p in row.search.points:
            values = " | ".join("-" if p.values.get(t.name) is None else f"{p.values[t.name]:,.0f}" for t in targets)
            tok = "-" if p.output_tok_s is None else f"{p.output_tok_s:,.0f}"
            out.append(
                f"| {row.preset} | {row.kv_dtype} | {p.nodes} | {values} | {'yes' if p.meets else 'no'} | "
                f"{p.errors} | {tok} | {p.virtual_s:,.0f} | {p.node_hours:,.2f} | {p.device_hours:,.2f} | "
                f"{p.wall_s:.1f} |"
            )
    findings = [(row, f) for row in lines for f in row.search.non_monotone]
    out += [
        "",
        "Search: node counts doubled from 1 until the SLO was met, then bisected, assuming more nodes never "
        "hurt; the count above each answer is checked too.",
    ]
    out += [f"- non-monotone ({row.preset}/{row.kv_dtype}): {f}" for row, f in findings] or [
        "- no non-monotone finding."
    ]
    return "\n".join(out) + "\n"


def _plot(path: Path, lines: Sequence[PlanLine], targets: Sequence[SloTarget]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(targets), figsize=(6.5 * len(targets), 4.5), squeeze=False)
    for axis, target in zip(axes[0], targets):
        for row in lines:
            points = [p for p in row.search.points if p.values.get(target.name) is not None]
            axis.plot(
                [p.nodes for p in points],
                [p.values[target.name] for p in points],
                marker="o",
                label=f"{row.preset}/{row.kv_dtype}",
            )
        axis.axhline(target.limit_ms, color="grey", linestyle="--", label=f"SLO {target.limit_ms:g} ms")
        axis.set_xlabel("nodes")
        axis.set_ylabel(f"{target.name.replace('_ms', '')} (ms)")
        axis.set_yscale("log")
        axis.set_title(f"{target.name} vs nodes")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
