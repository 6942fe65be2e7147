"""`kvbench run`'s own flags: what is run (config, engine, workload), the load point, how the run is carried out,
and the simulator's; the config sections', vLLM's and find-max's flags come from their modules."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvbench.cli import config_flags, find_max_flags, vllm_bench_flags, vllm_flags
from kvbench.cli.flag_types import at_least, checked_by, number_above
from kvbench.cli.live_progress import DEFAULT_EVERY_S
from kvbench.cli.run_config import DEFAULT_CONCURRENCY, DEFAULT_WORKLOAD
from kvbench.measure.schedule import BURSTINESS_RANGE, MAX_CONCURRENCY, MAX_COUNT, MAX_RATE
from kvbench.measure.stages import STAGE_EXAMPLE, STAGE_GAP_S, parse_stage, parse_stages


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of `kvbench run`, in the order --help shows them."""
    _add_target_flags(parser)
    _add_load_flags(parser)
    config_flags.add_flags(parser)
    vllm_flags.add_report_flags(parser)
    find_max_flags.add_flags(parser)
    vllm_bench_flags.add_flags(parser)
    _add_run_flags(parser)
    _add_sim_flags(parser)


def _add_target_flags(parser: argparse.ArgumentParser) -> None:
    """What is run: the config, or the engine, its settings and the workload."""
    parser.add_argument("config", nargs="?", type=Path, help="experiment matrix YAML (see kvbench/harness/config.py)")
    parser.add_argument("--engine", default=None, help="adapter name (default: kvengine, our own engine)")
    parser.add_argument("--url", help="base URL of a running OpenAI-compatible server (implies --engine endpoint)")
    parser.add_argument("--model", help="model name or path for the engine")
    parser.add_argument("--api-key", help="API key sent as a Bearer token")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine setting (repeatable), e.g. --set kv_dtype=fp8_e4m3; values are parsed as YAML; with "
        "CONFIG.yaml, it overrides that setting of every engine",
    )
    parser.add_argument(
        "--workload",
        default=None,
        help=f"profile name, trace/param file, or dataset: sharegpt:FILE (with --tokenizer), "
        f"dataset:PATH, random, prefix_repetition (default {DEFAULT_WORKLOAD})",
    )
    parser.add_argument(
        "--num-sessions", type=at_least(1, MAX_COUNT), help="sessions to generate (or trace rows to keep)"
    )


def _add_load_flags(parser: argparse.ArgumentParser) -> None:
    """The load point: one of an open loop, a closed loop, the trace's times or stages."""
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--rate",
        type=number_above(0, maximum=MAX_RATE),
        help="open loop: new SESSIONS per second (Poisson), each playing all its turns; for requests "
        "per second as vLLM counts them, use --request-rate",
    )
    load.add_argument(
        "--concurrency",
        type=at_least(1, MAX_CONCURRENCY),
        help=f"closed loop: requests in flight (default {DEFAULT_CONCURRENCY})",
    )
    load.add_argument("--trace-times", action="store_true", help="replay the workload's own arrival times")
    vllm_flags.add_load_flags(load, parser)
    load.add_argument(
        "--stages",
        type=checked_by(parse_stages),
        metavar="R:S,...",
        help=f"Poisson load stages RATE:SECONDS (e.g. {STAGE_EXAMPLE}), one after the other on one "
        f"server that keeps its cache, each drained before the next ({STAGE_GAP_S:g} s between); a "
        "row per stage; each request starts a session of the workload (--num-sessions defaults to "
        "their count)",
    )
    parser.add_argument(
        "--warmup-stage",
        type=checked_by(parse_stage),
        metavar="R:S",
        help="a stage before --stages, sent and recorded but left out of every result",
    )
    parser.add_argument(
        "--burstiness",
        type=number_above(BURSTINESS_RANGE[0], True, BURSTINESS_RANGE[1]),
        default=1.0,
        help="gamma shape for --rate or --request-rate (1.0 = Poisson; smaller is burstier), as vLLM's",
    )


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """How the run is carried out: where it runs, where it writes, what it prints."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="run on a Ray cluster (default address: auto): each engine setting as a Ray task on a "
        "node with its `resources`, the load workers as Ray actors (`local`: a one-machine cluster; put CONFIG.yaml "
        "first: kvbench run CONFIG.yaml --ray); needs pip install 'kvbench[ray]'",
    )
    parser.add_argument(
        "--progress-every",
        type=number_above(0),
        default=DEFAULT_EVERY_S,
        metavar="S",
        help=f"off a terminal (CI logs, pipes): a progress line every S seconds (default {DEFAULT_EVERY_S:g})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="results folder (default runs/<name>-<time>); one that holds a run is "
        "refused unless --resume or --overwrite is given",
    )
    reuse = parser.add_mutually_exclusive_group()
    reuse.add_argument(
        "--resume",
        action="store_true",
        help="finish the interrupted run in --out (same config): its finished requests are kept and not sent again",
    )
    reuse.add_argument(
        "--overwrite", action="store_true", help="replace the run in --out (its files are removed first)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print every cell's command line, environment, "
        "generated files and load plan, checked against the engine's --help; launch nothing "
        "(exit 2 on a flag the targeted version lacks)",
    )
    parser.add_argument(
        "--cell",
        action="append",
        default=[],
        metavar="LABEL",
        help="with CONFIG.yaml, run only this engine cell (repeatable): a cell's label, e.g. "
        "'vllm-prefix[kv_cache_dtype=auto]', or an engine's label for all its swept cells",
    )
    parser.add_argument(
        "--budget",
        type=number_above(0),
        metavar="MINUTES",
        help="refuse (exit 2) a plan whose cells' load, one after another, needs more than MINUTES "
        "(the dry run's total; e.g. the CI job's timeout-minutes)",
    )


def _add_sim_flags(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group("simulated engine (--engine sim; see `kvbench simulate --help`)")
    sim.add_argument("--sim-model", default="qwen2.5-72b", help="model geometry to simulate")
    sim.add_argument("--sim-hardware", default="8xh200", help="hardware profile to simulate")
    sim.add_argument("--sim-preset", action="append", default=[], help="policy preset, repeatable (default: all)")
    sim.add_argument("--sim-kv-dtype", action="append", default=[], help="KV dtype, repeatable (default fp8)")
