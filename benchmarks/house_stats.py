"""The house in numbers, for an issue note's before/after: modules, lines, the modules over 400 lines, function
lengths (median, p90, the longest), docstrings, and import cycles (counted as tests/test_import_direction.py
counts them, plus those closed only under `if TYPE_CHECKING:`).

    python benchmarks/house_stats.py [--longest 10]

Reads the kvbench package with `ast`; runs none of it.
"""

from __future__ import annotations

import argparse
import ast
import statistics

from tests.test_import_direction import PACKAGE_DIR, all_imports, cycles

LIMIT = 400


def _functions(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name, node.end_lineno - node.lineno + 1))
    return out


def _percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--longest", type=int, default=10, help="how many of the longest functions to list")
    args = parser.parse_args()

    sizes: dict[str, int] = {}
    functions: list[tuple[int, str]] = []
    documented = 0
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        name = str(path.relative_to(PACKAGE_DIR.parent))
        text = path.read_text()
        tree = ast.parse(text, name)
        sizes[name] = len(text.splitlines())
        documented += ast.get_docstring(tree) is not None
        functions += [(length, f"{name}:{fn}") for fn, length in _functions(tree)]

    imports = all_imports()
    running = cycles(imports)
    with_type_checking = cycles(imports, type_checking=True)
    lengths = [length for length, _ in functions]
    print("| what | value |\n| --- | --- |")
    print(f"| modules | {len(sizes)} |")
    print(f"| lines | {sum(sizes.values()):,} (median {statistics.median(sizes.values()):.0f} a module) |")
    print(f"| modules with a docstring | {documented} of {len(sizes)} |")
    over = sorted(((n, name) for name, n in sizes.items() if n > LIMIT), reverse=True)
    print(f"| modules over {LIMIT} lines | {len(over)}: " + ", ".join(f"{name} {n}" for n, name in over) + " |")
    print(
        f"| functions | {len(lengths)} (median {statistics.median(lengths):.0f} lines, p90 {_percentile(lengths, 0.9)}) |"
    )
    longest = sorted(functions, reverse=True)[: args.longest]
    print("| longest functions | " + ", ".join(f"{name} {n}" for n, name in longest) + " |")
    print(f"| import cycles (imports that run) | {len(running)} |")
    print(f"| import cycles counting TYPE_CHECKING | {len(with_type_checking)} |")
    for cycle in with_type_checking:
        print("\n" + cycle)


if __name__ == "__main__":
    main()
