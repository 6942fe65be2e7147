"""The targets of issue 44 over every published case, with one fit: a benchmark that prints and writes a table.

    python benchmarks/sim_validate_published.py --fit results/sim/published/fit-h100/fit.json \
        [--case results/sim/published/X.yaml ...] [--out results/sim/published/targets.md] [--seed 0]

Every case runs every arm with the fit (`kvbench validate-published`'s simulation; an H200 case gets the same fit
through its own profile: the fit's efficiencies of its peaks and the same overhead), and its comparison goes to
results/sim/published/<case>/comparison.{md,json} as it finishes, so an interrupted sweep keeps what it measured.
The table then has, per case and arm:

    throughput   whole-run total tok/s (else output tok/s, else request/s) within +-20% of published; a case
                 publishing only per-stage values: every stage's
    TTFT mean    whole-run within 1.5x; per stage within 1.5x, 2x on a saturated stage (published TTFT mean
                 over 5x the arm's lightest stage's)
    effects      every published effect in the published direction and within +-30% of its size
Simulated wall time per arm beside it. Targets are judged here, not in tests: they are accuracy goals.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvbench.sim.published import (
    WHOLE,
    Row,
    compare_arm,
    effect_rows,
    load_fit,
    parse_case,
)
from kvbench.sim.published_report import check_targets, effect_lines, write_comparison

CASES = Path(__file__).resolve().parents[1] / "results" / "sim" / "published"
THROUGHPUT_ORDER = ("total_tok_s", "output_tok_s", "request_s")


def throughput_rows(rows: list[Row]) -> list[Row]:
    """The rows the throughput target reads: the whole run's first published of THROUGHPUT_ORDER, else every
    stage's."""
    for metric in THROUGHPUT_ORDER:
        whole = [r for r in rows if r.stage == WHOLE and r.metric == metric and r.ratio is not None]
        if whole:
            return whole
    for metric in THROUGHPUT_ORDER:
        stages = [r for r in rows if r.stage != WHOLE and r.metric == metric and r.ratio is not None]
        if stages:
            return stages
    return []


def ttft_rows(rows: list[Row]) -> list[tuple[Row, float]]:
    """TTFT mean rows with their allowed factor (1.5x; 2x on a saturated stage)."""
    whole = [(r, 1.5) for r in rows if r.stage == WHOLE and r.metric == "ttft_mean_s" and r.ratio is not None]
    stages = [r for r in rows if r.stage != WHOLE and r.metric == "ttft_mean_s" and r.ratio is not None]
    lightest = min((r.published for r in stages), default=None)
    return whole + [(r, 2.0 if r.published > 5 * lightest else 1.5) for r in stages]


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "met" if ok else "NOT met"


def run_case(path: Path, fit_path: Path, seed: int) -> tuple[list[str], list[str]]:
    """One case: its comparison written beside it, its table lines and its effect lines."""
    case = parse_case(path)
    fit = load_fit(fit_path)
    rows, lines, header = [], [], [f"case: {path.name}", f"fit: {fit_path}", f"seed: {seed}"]
    for arm in case.arm_names:
        started = time.perf_counter()
        run = compare_arm(case, arm, fit, seed=seed)
        wall = time.perf_counter() - started
        header.append(
            f"{arm}: {len(run.result.records):,} requests, {run.result.virtual_s:,.0f} s virtual, "
            f"simulated in {wall:.0f} s"
        )
        arm_rows = list(run.rows)
        rows += arm_rows
        out = throughput_rows(arm_rows)
        worst = max(out, key=lambda r: abs(r.ratio - 1), default=None)
        ttft = ttft_rows(arm_rows)
        off = [(r, f) for r, f in ttft if not 1 / f <= r.ratio <= f]
        tp = (
            "-"
            if worst is None
            else (f"{worst.metric} {worst.stage}: {worst.published:,.4g} / {worst.simulated:,.4g} = {worst.ratio:.2f}")
        )
        tt = ", ".join(f"{r.stage} {r.ratio:.2f}" for r, _ in off[:4]) or ("all within" if ttft else "not published")
        whole_ttft = next((r for r, _ in ttft if r.stage == WHOLE), None)
        wt = (
            "-"
            if whole_ttft is None
            else f"{whole_ttft.published:.3g} / {whole_ttft.simulated:.3g} = {whole_ttft.ratio:.2f}"
        )
        lines.append(
            f"| {case.name} | {arm} | {tp} | {verdict(None if worst is None else all(0.8 <= r.ratio <= 1.2 for r in out))} "
            f"| {wt} | {verdict(None if not ttft else not off)} ({tt}) | {wall:.0f} s |"
        )
    effects = effect_rows(case, rows)
    effect_table = []
    for e in effects:
        ok = None if e.size_ratio is None else bool(e.same_direction and 0.7 <= e.size_ratio <= 1.3)
        effect_table.append(
            f"| {case.name} | {e.arm} over {e.over} | {e.stage} | {e.metric} | "
            f"{e.published_change * 100:+.1f}% | "
            f"{'-' if e.simulated_change is None else f'{e.simulated_change * 100:+.1f}%'} | "
            f"{verdict(ok)} |"
        )
    fitted = fit.rows_of(case.name)
    # The shipped case's own comparison (its single-case fit) stays; a fit across cases writes beside it.
    folder = CASES / case.name / "fit-across" if (CASES / case.name / "fit.json").exists() else CASES / case.name
    write_comparison(
        folder, case.name, rows, check_targets(rows, list(case.stage_labels), fitted), header, fitted, effects=effects
    )
    print("\n".join(header + lines + effect_lines(effects)), flush=True)
    return lines, effect_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", type=Path, required=True, help="a fit.json (kvbench calibrate --published)")
    parser.add_argument("--case", type=Path, action="append", default=[], help="cases (default: all of them)")
    parser.add_argument("--out", type=Path, default=CASES / "targets.md")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cases = args.case or sorted(CASES.glob("*.yaml"))
    head = [
        "# Targets over the published cases (issue 44)",
        "",
        (
            f"fit: {args.fit}; seed {args.seed}; `python benchmarks/sim_validate_published.py` (module docstring: "
            "the targets)"
        ),
        "",
        (
            "| case | arm | throughput (published / simulated = ratio, worst) | +-20% | TTFT mean whole run | "
            "TTFT mean (1.5x; 2x saturated) | simulated in |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    effects_head = [
        "",
        "## effects",
        "",
        "| case | arms | stage | metric | published | simulated | direction and +-30% |",
        "|---|---|---|---|---|---|---|",
    ]
    table, effects = [], []
    for path in cases:
        lines, effect_table = run_case(path, args.fit, args.seed)
        table += lines
        effects += effect_table
        args.out.write_text("\n".join(head + table + effects_head + effects) + "\n")  # after every case
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
