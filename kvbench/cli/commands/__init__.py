"""One module per `kvbench` subcommand; each has `register(subparsers, formatter)`."""

from kvbench.cli.commands import (
    bench_cmd,
    calibrate_cmd,
    compare_cmd,
    eval_cmd,
    plan_cmd,
    published_cmd,
    report_cmd,
    run_cmd,
    serve_cmd,
    sim_cmd,
    trace_cmd,
    workload_cmd,
)

ALL = (
    run_cmd,
    serve_cmd,
    eval_cmd,
    report_cmd,
    compare_cmd,
    workload_cmd,
    trace_cmd,
    sim_cmd,
    plan_cmd,
    calibrate_cmd,
    published_cmd,
    bench_cmd,
)
