"""No module of the kvbench package passes 400 lines (STYLE.md: a module that grows past it is split by concept).

A module over the limit may stand only in OVER_LIMIT below, with its line count as a ceiling it may not pass:
each is a module another change is splitting right now, and its entry goes when that change lands (after a
merge, `test_the_allow_list_holds_only_modules_still_over_the_limit` names the entries to remove).
"""

from __future__ import annotations

from pathlib import Path

import kvbench

LIMIT = 400
PACKAGE_DIR = Path(kvbench.__file__).parent

# Over the limit for now, each with the ceiling it may not grow past (its size when it was listed). Every entry
# is a module another change is splitting; the entry is removed once that change lands. Empty: every module is
# within the limit.
OVER_LIMIT: dict[str, int] = {}


def module_sizes() -> dict[str, int]:
    """Every module's line count, by its path below the package."""
    return {
        str(path.relative_to(PACKAGE_DIR)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
    }


def oversized(sizes: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """Each module over LIMIT that is not allowed, or that has grown past its allowed ceiling."""
    out = []
    for name, lines in sorted(sizes.items()):
        ceiling = allowed.get(name, LIMIT)
        if lines > ceiling:
            where = f"its ceiling in OVER_LIMIT is {ceiling}" if name in allowed else f"the limit is {LIMIT}"
            out.append(f"kvbench/{name}: {lines} lines ({where}): split it by concept")
    return out


def test_the_check_refuses_a_big_module_and_a_grown_one():
    assert oversized({"a.py": LIMIT}, {}) == []
    assert oversized({"a.py": LIMIT + 1}, {}) == ["kvbench/a.py: 401 lines (the limit is 400): split it by concept"]
    assert oversized({"a.py": 450}, {"a.py": 450}) == []
    assert oversized({"a.py": 451}, {"a.py": 450}) == [
        "kvbench/a.py: 451 lines (its ceiling in OVER_LIMIT is 450): split it by concept"
    ]


def test_no_module_passes_400_lines():
    found = oversized(module_sizes(), OVER_LIMIT)
    assert not found, "modules too long:\n" + "\n".join(found)


def test_the_allow_list_holds_only_modules_still_over_the_limit():
    # An entry whose module was split (or removed) goes, so the list only ever shrinks.
    sizes = module_sizes()
    stale = [f"{name} ({sizes.get(name, 'gone')})" for name in OVER_LIMIT if sizes.get(name, 0) <= LIMIT]
    assert not stale, "remove from OVER_LIMIT, now within the limit: " + ", ".join(stale)
