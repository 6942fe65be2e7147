"""`kvbench`: the command line. Parses flags, calls the harness, prints with rich; computes nothing itself."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich_argparse import RichHelpFormatter

from kvbench.cli.flag_types import OneLineParser
from kvbench.engines.base import EngineError
from kvbench.settings import SettingsError
from kvbench.workloads.spec import WorkloadError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

console = Console()
errors = Console(stderr=True, soft_wrap=True)  # one line per error, whatever the width


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except (
        SettingsError,
        WorkloadError,
        FileNotFoundError,
        IsADirectoryError,
        NotADirectoryError,
        PermissionError,
    ) as exc:
        # One line, whatever the message embeds (a YAML parser's multi-line report, say).
        errors.print(f"[bold red]error:[/bold red] {escape(' '.join(str(exc).split()))}", highlight=False)
        return EXIT_USAGE
    except EngineError as exc:
        errors.print(f"[bold red]engine error:[/bold red] {escape(str(exc))}", highlight=False)
        return EXIT_FAILED
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted[/yellow]: results written so far are kept")
        return EXIT_FAILED


class HelpFormatter(RichHelpFormatter):
    """rich-argparse with help text read as plain text: `pip install 'kvbench[ray]'` and a cell label
    `vllm-prefix[kv_cache_dtype=auto]` keep their brackets (rich markup would swallow them), and group titles
    keep their case (`SLA search`, not `Sla Search`)."""

    help_markup = False
    text_markup = False
    group_name_formatter = staticmethod(lambda name: name[:1].upper() + name[1:])


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kvbench",
        description="Benchmark and evaluation harness for the KV cache of LLM serving engines.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvbench {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    from kvbench.cli import commands as command_modules

    for module in command_modules.ALL:
        module.register(commands, HelpFormatter)
    return parser


def _version() -> str:
    """The installed distribution's version (the editable install's pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvbench")
    except PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
