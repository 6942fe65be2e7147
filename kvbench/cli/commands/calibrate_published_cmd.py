"""`kvbench calibrate --published CASE.yaml`: the fit of `sim/calibrate_published.py`, written and checked."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from kvbench.settings import SettingsError

console = Console()
H200_PROFILE = "8xh200"


def handle_published(args: argparse.Namespace) -> int:
    from kvbench.cli.commands.published_cmd import print_rows
    from kvbench.sim.calibrate_published import fit_published, residual_lines, transfer
    from kvbench.sim.hardware import load_hardware, save_hardware
    from kvbench.sim.published import CaseError, compare_arm, parse_case
    from kvbench.sim.published_report import check_targets, write_comparison

    if len(args.published) > 1:
        return handle_across(args)
    args.published = args.published[0]
    try:
        case = parse_case(args.published)
    except CaseError as error:
        raise SettingsError(str(error)) from None
    if args.fit_router not in case.arm_names:
        raise SettingsError(f"--fit-router {args.fit_router}: the case's arms are {', '.join(case.arm_names)}")
    out = args.out or args.published.with_suffix("")
    out.mkdir(parents=True, exist_ok=True)

    def seen(e):
        console.print(
            f"  FLOP eff {e.fit.flops_efficiency:.3f}, BW eff {e.fit.bw_efficiency:.3f}, step "
            f"{e.fit.step_overhead_s * 1e3:.2f} ms, router {e.fit.router_latency_s * 1e3:.0f} ms: "
            f"cost {e.cost:.4f} ({e.wall_s:.0f} s)"
        )

    try:
        result = fit_published(
            case,
            args.fit_router,
            args.max_rate,
            max_evaluations=args.max_evaluations,
            on_evaluation=seen,
            throughput_rates=args.fit_throughput_at,
        )
    except ValueError as error:
        raise SettingsError(f"{args.published}: {error}") from None
    fit = result.fit
    fit_json = out / "fit.json"
    fit_json.write_text(json.dumps(result.to_dict(), indent=1))
    h200 = transfer(fit, load_hardware(H200_PROFILE))
    h200_json = out / f"{H200_PROFILE}-fitted.json"
    save_hardware(h200, h200_json)
    lines = [
        f"# {case.name}: fit",
        "",
        f"fitted on {fit.fitted_on} in {result.wall_s:.0f} s ({len(result.evaluations)} simulations)",
        "",
        f"- FLOP/s efficiency {fit.flops_efficiency:.3f}, bandwidth efficiency {fit.bw_efficiency:.3f}, "
        f"step overhead {fit.step_overhead_s * 1e3:.2f} ms, router latency {fit.router_latency_s * 1e3:.0f} ms "
        "(precise-prefix only)",
        f"- {H200_PROFILE} takes the same efficiencies of its own datasheet peaks ({h200_json.name}): "
        "effective bandwidth x 4.8/3.35 of the H100's, dense bf16 FLOP/s the same (989 TFLOP/s both)",
        "",
        "| stage | metric | published | simulated | ratio |",
        "|---|---|---|---|---|",
        *residual_lines(result.rows),
    ]
    (out / "fit.md").write_text("\n".join(lines) + "\n")
    console.print("\n".join(lines[2:5]))
    files = [fit_json, out / "fit.md", h200_json]
    if not args.no_check:
        rows = []
        header = [f"case: {args.published}", f"fit: {fit_json} ({fit.fitted_on})"]
        for route in case.arm_names:
            run = compare_arm(case, route, fit)
            header.append(f"{route}: {len(run.result.records):,} requests simulated in {run.result.wall_s:.0f} s")
            rows += run.rows
            print_rows(run.rows, route)
        targets = check_targets(rows, list(case.stage_labels), fit.fitted_rows)
        for t in targets:
            console.print(f"{'met' if t.met else 'not met' if t.met is False else 'n/a'}: {t.name} ({t.detail})")
        files += write_comparison(out, case.name, rows, targets, header, fit.fitted_rows)
    console.print(f"results: {', '.join(str(f) for f in files)}")
    return 0


def handle_across(args: argparse.Namespace) -> int:
    """`kvbench calibrate --published A.yaml B.yaml ...`: one fit across the cases (`fit_across`), written to
    --out (default results/sim/published/fit-<profile>/) with the H200 profile carried from it."""
    from kvbench.sim.calibrate_published import FitPart, fit_across, transfer
    from kvbench.sim.hardware import load_hardware, save_hardware
    from kvbench.sim.published import CaseError, parse_case

    try:
        cases = [parse_case(path) for path in args.published]
    except CaseError as error:
        raise SettingsError(str(error)) from None
    parts = [
        FitPart(c, args.fit_router if args.fit_router in c.arm_names else c.arm_names[0], args.max_rate) for c in cases
    ]
    out = args.out or args.published[0].parent / f"fit-{cases[0].hardware}"
    out.mkdir(parents=True, exist_ok=True)

    def seen(e):
        console.print(
            f"  step {e.fit.step_overhead_s * 1e3:.2f} ms, router {e.fit.router_latency_s * 1e3:.0f} ms: "
            f"cost {e.cost:.4f} ({e.wall_s:.0f} s)"
        )

    try:
        result = fit_across(parts, max_evaluations=args.max_evaluations, on_evaluation=seen)
    except ValueError as error:
        raise SettingsError(str(error)) from None
    fit = result.fit
    (out / "fit.json").write_text(json.dumps(result.to_dict(), indent=1))
    h200 = transfer(fit, load_hardware(H200_PROFILE))
    save_hardware(h200, out / f"{H200_PROFILE}-fitted.json")
    lines = [
        f"# one fit across {len(cases)} cases ({cases[0].hardware})",
        "",
        (
            f"fitted on {fit.fitted_on} in {result.wall_s:.0f} s ({len(result.evaluations)} evaluations, each "
            "simulating every part)"
        ),
        "",
        (
            f"- step overhead {fit.step_overhead_s * 1e3:.2f} ms, router latency {fit.router_latency_s * 1e3:.0f} "
            f"ms (precise-prefix arms only); efficiencies {fit.flops_efficiency:.2f} / {fit.bw_efficiency:.2f} "
            "kept (kernel tables price the steps)"
        ),
        "",
        "| arm | stage | metric | published | simulated | ratio |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r.arm} | {r.stage} | {r.metric} | {r.published:g} | {r.simulated:.4g} | {r.ratio:.3f} |"
            for r in result.rows
            if r.ratio is not None
        ],
    ]
    (out / "fit.md").write_text("\n".join(lines) + "\n")
    console.print("\n".join(lines[2:5]))
    console.print(f"results: {out / 'fit.json'}, {out / 'fit.md'}, {out / (H200_PROFILE + '-fitted.json')}")
    return 0
