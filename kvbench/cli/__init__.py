"""The `kvbench` command line: the one room that may import every other (harness, engines, simulator, evals).

`main.py` parses flags and dispatches to one module per subcommand in `commands/`; they call into the rooms
below and print with rich. Nothing below imports this package.
"""
