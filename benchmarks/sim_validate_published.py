"""The targets of issue 44 over every published case, with one fit: a benchmark that prints and writes a table.

    python benchmarks/sim_validate_published.py --fit results/sim/published/fit-h100/fit.json \
        [--case results/sim/published/X.yaml ...] [--out results/sim/published/targets.md] [--seed 0 | --seeds 0,1,2]
    python benchmarks/sim_validate_published.py --from-comparisons results/sim/published/CASE ... [--out ...]

`--seeds` runs every arm once per seed and judges the median across them (`published.across_seeds`; the
comparison lists each seed's value). `--from-comparisons` rebuilds the table from comparison.json files already
written (a folder or the file itself), simulating nothing: the sweep can run case by case, anywhere, and the
table be put together afterwards.

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
import json
import time
from pathlib import Path

from kvbench.sim.published import (
    WHOLE,
    EffectRow,
    Row,
    across_seeds,
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


def arm_line(case_name: str, arm: str, arm_rows: list[Row], wall: float | None) -> str:
    """The targets table's line of one arm."""
    out = throughput_rows(arm_rows)
    worst = max(out, key=lambda r: abs(r.ratio - 1), default=None)
    ttft = ttft_rows(arm_rows)
    off = [(r, f) for r, f in ttft if not 1 / f <= r.ratio <= f]
    tp = (
        "-"
        if worst is None
        else f"{worst.metric} {worst.stage}: {worst.published:,.4g} / {worst.simulated:,.4g} = {worst.ratio:.2f}"
    )
    tt = ", ".join(f"{r.stage} {r.ratio:.2f}" for r, _ in off[:4]) or ("all within" if ttft else "not published")
    whole_ttft = next((r for r, _ in ttft if r.stage == WHOLE), None)
    wt = (
        "-"
        if whole_ttft is None
        else f"{whole_ttft.published:.3g} / {whole_ttft.simulated:.3g} = {whole_ttft.ratio:.2f}"
    )
    throughput_ok = None if worst is None else all(0.8 <= r.ratio <= 1.2 for r in out)
    return (
        f"| {case_name} | {arm} | {tp} | {verdict(throughput_ok)} | {wt} | {verdict(None if not ttft else not off)} "
        f"({tt}) | {'-' if wall is None else f'{wall:.0f} s'} |"
    )


def effect_line(case_name: str, e: EffectRow) -> str:
    ok = None if e.size_ratio is None else bool(e.same_direction and 0.7 <= e.size_ratio <= 1.3)
    simulated = "-" if e.simulated_change is None else f"{e.simulated_change * 100:+.1f}%"
    return (
        f"| {case_name} | {e.arm} over {e.over} | {e.stage} | {e.metric} | {e.published_change * 100:+.1f}% | "
        f"{simulated} | {verdict(ok)} |"
    )


def case_lines(case_name: str, rows: list[Row], walls: dict, effects: list[EffectRow]) -> tuple[list[str], list[str]]:
    arms = dict.fromkeys(r.arm for r in rows)
    lines = [arm_line(case_name, arm, [r for r in rows if r.arm == arm], walls.get(arm)) for arm in arms]
    return lines, [effect_line(case_name, e) for e in effects]


def run_case(path: Path, fit_path: Path, seeds: list[int]) -> tuple[list[str], list[str]]:
    """One case over `seeds` (the median across them, `published.across_seeds`): its comparison written beside
    it, its table lines and its effect lines."""
    case = parse_case(path)
    fit = load_fit(fit_path)
    header = [f"case: {path.name}", f"fit: {fit_path}", f"seeds: {','.join(map(str, seeds))}"]
    per_seed: list[list[Row]] = [[] for _ in seeds]
    walls: dict[str, float] = {}
    for arm in case.arm_names:
        for i, seed in enumerate(seeds):
            started = time.perf_counter()
            run = compare_arm(case, arm, fit, seed=seed)
            wall = time.perf_counter() - started
            walls[arm] = walls.get(arm, 0.0) + wall / len(seeds)
            header.append(
                f"{arm} seed {seed}: {len(run.result.records):,} requests, {run.result.virtual_s:,.0f} s virtual, "
                f"simulated in {wall:.0f} s"
            )
            per_seed[i] += list(run.rows)
    spreads = across_seeds(per_seed) if len(seeds) > 1 else ()
    rows = [s.row for s in spreads] if spreads else per_seed[0]
    effects = effect_rows(case, rows)
    fitted = fit.rows_of(case.name)
    # The shipped case's own comparison (its single-case fit) stays; a fit across cases writes beside it.
    folder = CASES / case.name / "fit-across" if (CASES / case.name / "fit.json").exists() else CASES / case.name
    write_comparison(
        folder,
        case.name,
        rows,
        check_targets(rows, list(case.stage_labels), fitted),
        header,
        fitted,
        spreads=spreads,
        seeds=seeds if len(seeds) > 1 else (),
        effects=effects,
        extra={"wall_s": walls},
    )
    lines, effect_table = case_lines(case.name, rows, walls, effects)
    print("\n".join(header + lines + effect_lines(effects)), flush=True)
    return lines, effect_table


def from_comparison(folder: Path) -> tuple[list[str], list[str]]:
    """A case's table lines and effect lines from its already-written `folder/comparison.json` (no simulation)."""
    path = folder / "comparison.json" if folder.is_dir() else folder
    if not path.is_file():
        raise SystemExit(f"--from-comparisons {folder}: no comparison.json there; run the case first")
    doc = json.loads(path.read_text())
    rows = [Row(r["arm"], r["stage"], r["metric"], r["published"], r["simulated"]) for r in doc["rows"]]
    effects = [
        EffectRow(e["arm"], e["over"], e["metric"], e.get("stage", WHOLE), e["published_change"], e["simulated_change"])
        for e in doc["effects"]
    ]
    return case_lines(doc["case"], rows, doc.get("wall_s", {}), effects)


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: give integers separated by commas, as 0,1,2") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds: give at least one seed, as 0 or 0,1,2")
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", type=Path, help="a fit.json (kvbench calibrate --published)")
    parser.add_argument("--case", type=Path, action="append", default=[], help="cases (default: all of them)")
    parser.add_argument("--out", type=Path, default=CASES / "targets.md")
    parser.add_argument("--seed", type=int, default=None, help="one seed (default 0)")
    parser.add_argument("--seeds", type=seed_list, default=None, help="several seeds, as 0,1,2: the median of them")
    parser.add_argument(
        "--from-comparisons",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="rebuild the table from these cases' comparison.json (folders or files) without simulating",
    )
    args = parser.parse_args()
    if args.seed is not None and args.seeds is not None:
        parser.error("give --seed or --seeds, not both")
    seeds = args.seeds or [args.seed if args.seed is not None else 0]
    if args.from_comparisons is None and args.fit is None:
        parser.error("--fit is required (or --from-comparisons DIR... to rebuild from written comparisons)")
    source = (
        f"rebuilt from {len(args.from_comparisons)} comparison.json files (--from-comparisons)"
        if args.from_comparisons
        else f"fit: {args.fit}; seeds {','.join(map(str, seeds))}"
    )
    head = [
        "# Targets over the published cases (issue 44)",
        "",
        f"{source}; `python benchmarks/sim_validate_published.py` (module docstring: the targets)",
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
    jobs = (
        [lambda f=f: from_comparison(f) for f in args.from_comparisons]
        if args.from_comparisons
        else [lambda p=p: run_case(p, args.fit, seeds) for p in (args.case or sorted(CASES.glob("*.yaml")))]
    )
    for job in jobs:
        lines, effect_table = job()
        table += lines
        effects += effect_table
        args.out.write_text("\n".join(head + table + effects_head + effects) + "\n")  # after every case
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
