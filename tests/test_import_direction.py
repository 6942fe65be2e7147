"""Imports point the way the README's Layout says: every module of the kvbench package is read with `ast`
(imports at the top level, inside functions and under `if TYPE_CHECKING:` alike) and each forbidden import is
reported as `module:line: import`.

Rules (a module's room is its package path):
- the engine core (kvbench.engines.kvengine.core) imports no torch, asyncio, aiohttp, and none of the
  modules that do file or network I/O (pathlib, os, io, json, yaml, sqlite3, redis, socket), nor calls the
  builtin `open`: it takes ints and returns small frozen results;
- kvbench.harness does not import our engine's core, model or runtime (it measures engines over HTTP);
- kvbench.workloads imports neither kvbench.harness nor kvbench.engines;
- kvbench.measure (shared by the real harness and the simulator) imports neither harness, engines, sim nor cli;
- kvbench.sim imports neither kvbench.harness nor kvbench.cli, nor our engine's runtime, model or server (it
  reads the engine's settings/ only);
- our engine's settings/ imports neither its runtime, model, server nor torch;
- kvbench.harness and kvbench.evals do not import each other (the run measures, the evals score quality; what
  both need lives below them, in measure), and neither harness nor measure imports kvbench.verdicts;
- kvbench.verdicts (everything that judges a change) imports of kvbench only what VERDICTS_MAY_IMPORT names:
  the run folder and metrics (measure), the config schema and environment it compares, the shipped eval tasks;
- only kvbench.cli imports kvbench.cli;
- no import cycle between modules, counting every import that can run: module level and inside functions alike
  (a function-level import only hides a cycle from the interpreter, not from the reader);
- nor one closed under `if TYPE_CHECKING:` (issue 49: such an import never runs, but the two modules still
  know each other, as runtime/engine.py and runtime/prefill_budget.py once did): no cycle of any kind.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import kvbench

PACKAGE_DIR = Path(kvbench.__file__).parent
CORE = "kvbench.engines.kvengine.core"
CORE_FORBIDDEN = ("torch", "asyncio", "aiohttp", "pathlib", "os", "io", "json", "yaml", "sqlite3", "redis", "socket")

# (importing room, imported room, why): a module in the first may not import a module in the second.
RULES = (
    ("kvbench.harness", "kvbench.engines.kvengine.core", "the harness measures engines over HTTP"),
    ("kvbench.harness", "kvbench.engines.kvengine.model", "the harness measures engines over HTTP"),
    ("kvbench.harness", "kvbench.engines.kvengine.runtime", "the harness measures engines over HTTP"),
    ("kvbench.workloads", "kvbench.harness", "workloads know no runner"),
    ("kvbench.workloads", "kvbench.engines", "workloads know no engine"),
    ("kvbench.measure", "kvbench.harness", "measure is shared by the harness and the simulator"),
    ("kvbench.measure", "kvbench.engines", "measure is shared by the harness and the simulator"),
    ("kvbench.measure", "kvbench.sim", "measure is shared by the harness and the simulator"),
    ("kvbench.measure", "kvbench.cli", "measure is shared by the harness and the simulator"),
    ("kvbench.sim", "kvbench.harness", "the simulator replays workloads without the real harness"),
    ("kvbench.sim", "kvbench.cli", "the CLI sits at the edge"),
    ("kvbench.sim", "kvbench.engines.kvengine.runtime", "the simulator reads the engine's settings, not its runtime"),
    ("kvbench.sim", "kvbench.engines.kvengine.model", "the simulator reads the engine's settings, not its model"),
    ("kvbench.sim", "kvbench.engines.kvengine.server", "the simulator reads the engine's settings, not its server"),
    ("kvbench.engines.kvengine.settings", "kvbench.engines.kvengine.runtime", "settings sit below the runtime"),
    ("kvbench.engines.kvengine.settings", "kvbench.engines.kvengine.model", "settings sit below the model"),
    ("kvbench.engines.kvengine.settings", "kvbench.engines.kvengine.server", "settings sit below the server"),
    ("kvbench.engines.kvengine.settings", "torch", "settings are torch-free: the adapter and the CLI read them"),
    ("kvbench.harness", "kvbench.evals", "the run measures, the evals score quality: shared code lives in measure"),
    ("kvbench.evals", "kvbench.harness", "the evals score quality over HTTP: shared code lives in measure"),
    ("kvbench.harness", "kvbench.verdicts", "the harness measures; verdicts judge what it wrote"),
    ("kvbench.measure", "kvbench.verdicts", "measure is shared by the harness and the simulator"),
)

# The only kvbench rooms a verdicts module may import: it reads run folders, it runs nothing.
VERDICTS = "kvbench.verdicts"
VERDICTS_MAY_IMPORT = (
    VERDICTS,
    "kvbench.measure",
    "kvbench.distribution",
    "kvbench.harness.config_schema",
    "kvbench.harness.env",
    "kvbench.evals.tasks",
)


@dataclass(frozen=True)
class Import:
    """One import statement's module (or, target OPEN_CALL, a call of the builtin `open`)."""

    module: str  # the importing module
    line: int
    target: str  # the imported module (absolute)
    at_import_time: bool  # module level and not under `if TYPE_CHECKING:`
    type_checking: bool = False  # under `if TYPE_CHECKING:`: never runs

    def __str__(self) -> str:
        what = "calls open()" if self.target == OPEN_CALL else f"import {self.target}"
        return f"{self.module}:{self.line}: {what}"


OPEN_CALL = "open()"


def within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, for its __init__)."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, path: Path, modules: set[str]) -> list[Import]:
    """Every import statement of a module; `from X import Y` counts as importing X.Y when that is a module."""
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, at_import_time: bool, type_checking: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            at_import_time = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False, True)
            for child in node.orelse:
                visit(child, at_import_time, type_checking)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            found.append(Import(module, node.lineno, OPEN_CALL, False))
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(module, node.lineno, alias.name, at_import_time, type_checking))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
            if len(targets) < len(node.names):  # some names are attributes of `base` itself
                targets.insert(0, base)
            for target in targets:
                found.append(Import(module, node.lineno, target, at_import_time, type_checking))
        for child in ast.iter_child_nodes(node):
            visit(child, at_import_time, type_checking)

    visit(ast.parse(path.read_text(), str(path)), True, False)
    return found


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def all_imports() -> list[Import]:
    files = module_files()
    names = set(files)
    return [imp for module, path in files.items() for imp in imports_of(module, path, names)]


def violations(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        top = imp.target.split(".")[0]
        if within(imp.module, CORE) and (top in CORE_FORBIDDEN or imp.target == OPEN_CALL):
            out.append(f"{imp}  (the engine core does no torch, asyncio, HTTP or file I/O)")
        for importer, imported, why in RULES:
            if within(imp.module, importer) and within(imp.target, imported):
                out.append(f"{imp}  ({importer} may not import {imported}: {why})")
        if (
            within(imp.module, VERDICTS)
            and within(imp.target, "kvbench")
            and imp.target != "kvbench"
            and not any(within(imp.target, room) for room in VERDICTS_MAY_IMPORT)
        ):
            out.append(
                f"{imp}  (kvbench.verdicts imports only {', '.join(VERDICTS_MAY_IMPORT)}: it judges run folders)"
            )
        if within(imp.target, "kvbench.cli") and not within(imp.module, "kvbench.cli"):
            out.append(f"{imp}  (only kvbench.cli imports kvbench.cli: the CLI sits at the edge)")
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node (or a node importing itself), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return components


def _counts(imp: Import, type_checking: bool = False) -> bool:
    """An import that can run (module level or in a function), or with `type_checking` any import, of another
    kvbench module."""
    return (
        (type_checking or not imp.type_checking)
        and imp.target.startswith("kvbench")
        and imp.target != imp.module
        and imp.target != OPEN_CALL
    )


def cycles(imports: list[Import], type_checking: bool = False) -> list[str]:
    """Each import cycle, as the imports (module or function level; with `type_checking` those under
    `if TYPE_CHECKING:` too) between the modules of one strongly connected component. A package's `__init__`
    importing its own submodules is not a cycle: it is the package."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.module, set())
        if _counts(imp, type_checking) and not within(
            imp.module, imp.target
        ):  # a submodule importing its package's __init__
            graph[imp.module].add(imp.target)
    out = []
    for component in strongly_connected(graph):
        members = set(component)
        edges = sorted(
            {
                str(imp)
                for imp in imports
                if _counts(imp, type_checking) and imp.module in members and imp.target in members
            }
        )
        out.append("cycle between " + ", ".join(component) + ":\n    " + "\n    ".join(edges))
    return out


def test_the_walk_sees_every_kind_of_import():
    # The checker itself: a relative import inside a function, a TYPE_CHECKING import and a submodule by name.
    imports = all_imports()
    assert len({imp.module for imp in imports}) > 50
    assert any(not imp.at_import_time for imp in imports)
    assert _absolute("kvbench.sim.engine", False, "node", 1) == "kvbench.sim.node"
    assert _absolute("kvbench.sim", True, None, 2) == "kvbench"
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
    # A cycle closed only by a function-level import counts; one closed under TYPE_CHECKING does not.
    top, in_function = Import("kvbench.a", 1, "kvbench.b", True), Import("kvbench.b", 9, "kvbench.a", False)
    assert cycles([top, in_function]) == [
        "cycle between kvbench.a, kvbench.b:\n    kvbench.a:1: import kvbench.b\n    kvbench.b:9: import kvbench.a"
    ]
    only_typed = Import("kvbench.b", 9, "kvbench.a", False, type_checking=True)
    assert cycles([top, only_typed]) == []
    assert cycles([top, only_typed], type_checking=True) == [
        "cycle between kvbench.a, kvbench.b:\n    kvbench.a:1: import kvbench.b\n    kvbench.b:9: import kvbench.a"
    ]
    assert (
        cycles(
            [Import("kvbench.sim.engine", 1, "kvbench.sim", True), Import("kvbench.sim", 1, "kvbench.sim.engine", True)]
        )
        == []
    )
    # A room rule counts an import inside a function and one under TYPE_CHECKING alike.
    assert violations([Import("kvbench.harness.a", 5, "kvbench.evals.b", False)])
    assert violations([Import("kvbench.evals.b", 3, "kvbench.harness.a", False, type_checking=True)])
    assert violations([Import("kvbench.verdicts.a", 3, "kvbench.harness.loadgen", False)])
    assert not violations([Import("kvbench.verdicts.a", 3, "kvbench.measure.run_folder", True)])


def test_imports_point_the_way_the_layout_says():
    found = violations(all_imports())
    assert not found, "forbidden imports:\n" + "\n".join(found)


def test_no_import_cycles():
    found = cycles(all_imports())
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_import_cycles_even_under_type_checking():
    # A type-only import back the other way is still a cycle for the reader: move the shared type below both.
    found = cycles(all_imports(), type_checking=True)
    assert not found, "import cycles (counting `if TYPE_CHECKING:` imports):\n" + "\n".join(found)
