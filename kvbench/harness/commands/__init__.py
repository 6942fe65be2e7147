"""One module per `kvbench` subcommand; each has `register(subparsers, formatter)`."""

from kvbench.harness.commands import report_cmd, run_cmd, trace_cmd, workload_cmd

ALL = (run_cmd, report_cmd, workload_cmd, trace_cmd)
