"""`kvbench eval`: FP16/FP32 vs FP8 KV quality (lm-eval tasks + direct divergence) into a run folder."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from kvbench.cli.flag_types import at_least

console = Console()


def register(commands, formatter) -> None:
    parser = commands.add_parser(
        "eval",
        help="quality of each KV setting against the unquantized baseline",
        description="For each KV setting: start the engine, run the shipped lm-eval tasks through local-completions, "
        "then (our engine) measure KL, top-1 agreement, perplexity and greedy divergence in-process. Writes "
        "OUT/eval.md, eval.csv (paired deltas with 95% intervals), eval_summary.csv, eval.json and the position "
        "and per-layer plots. Defaults are the CI size; --full is the documented "
        "full run. Flags override CONFIG.yaml (keys: kvbench/evals/runner.py EvalConfig).",
        formatter_class=formatter,
    )
    parser.add_argument("config", nargs="?", type=Path, help="YAML with EvalConfig keys")
    parser.add_argument(
        "--engine",
        help="kvengine (default; divergence in-process, exact) or vllm, sglang, lmcache, "
        "trtllm (each KV setting served by that engine; divergence from prompt logprobs where it "
        "returns them); engine settings go in CONFIG.yaml's engine_settings",
    )
    parser.add_argument("--model", help="model for the engine (default: the default SmolLM2 model)")
    parser.add_argument(
        "--kv-dtype",
        help="comma list, the first unquantized one is the baseline "
        "(default fp32,fp16,fp8_e4m3,fp8_e5m2; another engine takes its own names, e.g. vLLM's "
        "--kv-cache-dtype auto,bfloat16,fp8_e4m3, TensorRT-LLM's auto,fp8)",
    )
    parser.add_argument("--kv-scale", help="comma list of fp8 scale modes (default tensor,channel)")
    parser.add_argument(
        "--tasks",
        help="comma list of lm-eval tasks: the shipped offline ones (default all of them) "
        "and lm-eval's own (e.g. arc_easy; `lm-eval ls tasks`), whose data comes from the Hugging Face "
        "hub or the local datasets cache",
    )
    parser.add_argument("--limit", type=at_least(1), help="documents per lm-eval task (default 3; --full: 40)")
    parser.add_argument(
        "--full",
        action="store_true",
        help="the documented full run (results/evals/: kvbench/evals/runner.py FULL_RUN; ~35 min on 2 CPU cores)",
    )
    parser.add_argument(
        "--perf-run",
        type=Path,
        help="a `kvbench run` folder of the same KV settings: adds the "
        "quality-vs-performance table and plot (eval_tradeoff.md/.csv/.png)",
    )
    parser.add_argument("--no-lm-eval", action="store_true", help="direct divergence only")
    parser.add_argument("--no-divergence", action="store_true", help="lm-eval only")
    parser.add_argument("--out", type=Path, help="run folder (default runs/eval-<time>)")
    parser.set_defaults(handler=handle)


def config_values(args: argparse.Namespace) -> dict:
    from kvbench.settings import SettingsError, read_yaml

    values: dict = {}
    if args.config is not None:
        values = read_yaml(args.config, "eval config") or {}
        if not isinstance(values, dict):
            raise SettingsError(f"{args.config}: expected a mapping of EvalConfig keys")
    if args.full:
        from kvbench.evals.runner import FULL_RUN

        values.update(FULL_RUN)
    for key, value in (("engine", args.engine), ("model", args.model), ("limit", args.limit)):
        if value is not None:
            values[key] = value
    for key, value in (("kv_dtypes", args.kv_dtype), ("kv_scales", args.kv_scale), ("tasks", args.tasks)):
        if value is not None:
            values[key] = [item.strip() for item in value.split(",") if item.strip()]
    if args.perf_run is not None:
        values["perf_run"] = str(args.perf_run)
    if args.no_lm_eval:
        values["lm_eval"] = False
    if args.no_divergence:
        values["divergence"] = False
    return values


def handle(args: argparse.Namespace) -> int:
    from kvbench.evals.runner import load_eval_config, run_eval

    config = load_eval_config(config_values(args), str(args.config or "flags"))
    run_dir = args.out or Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"[bold]kvbench eval[/bold] -> {run_dir}")

    paths = run_eval(config, run_dir, progress=lambda message: console.print(f"  {message}", highlight=False))
    print_eval_summary(paths)
    console.print(f"results: {', '.join(str(path) for path in paths.values())}")
    return 0


def print_eval_summary(paths) -> None:
    """The eval's summary in kvbench's console table style (numbers never cut); eval.md holds the rest (paired
    deltas, the baseline's scores, positions), as Markdown."""
    import math

    import pandas as pd

    from kvbench.cli.console_table import Column, print_table
    from kvbench.evals.report import summary_cell
    from kvbench.measure.run_folder import EVAL_MD, EVAL_SUMMARY_CSV

    if EVAL_SUMMARY_CSV not in paths or not paths[EVAL_SUMMARY_CSV].exists():
        return
    frame = pd.read_csv(paths[EVAL_SUMMARY_CSV])
    columns = [Column(str(column), frame[column].dtype.kind in "fi") for column in frame.columns]
    rows = [
        [
            escape("n/a" if isinstance(value, float) and math.isnan(value) else summary_cell(str(column), value))
            for column, value in row.items()
        ]
        for _, row in frame.iterrows()
    ]
    print_table(console, columns, rows, title="KV quality eval: summary")
    console.print(
        f"paired deltas with intervals, the baseline's scores and positions: {paths[EVAL_MD]}", highlight=False
    )
