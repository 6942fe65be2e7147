"""Can each cell of the matrix start on this machine? Checked for every cell before the first one launches
(`kvbench run`), and printed per cell by the dry run: a run whose fourth engine cannot start should fail in a
second, not after the first three have run for hours.

A cell cannot start here when
- the interpreter (or executable) of its command is not there, or the engine is not installed for it (vLLM's
  and SGLang's pins clash with ours: they live in their own venvs, named by the `python` setting or
  $KVBENCH_VLLM_PYTHON / $KVBENCH_SGLANG_PYTHON);
- its model is a local path (absolute, or starting with ./ ../ ~) that is missing or unreadable;
- its command uses a flag, or a value, the installed engine's --help does not list (where it is installed);
- it is a running server (an endpoint) that does not serve the model asked for (its /v1/models, before the
  first request: a wrong --model would otherwise fail every request with a 404).
Nothing is launched: the checks run the interpreter only to ask what is installed, and --help; an endpoint is
asked for its model list.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.launch import command_problems, help_flags, respell
from kvbench.engines.registry import engine_factory
from kvbench.harness.config import ExperimentConfig
from kvbench.measure.run_folder import engine_dir
from kvbench.settings import SettingsError


@dataclass(frozen=True)
class CellReadiness:
    """One engine cell: why it cannot start here (empty: it can, as far as can be told without starting it)."""

    label: str
    reasons: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.reasons


def start_problems(adapter, installed_help=None) -> list[str]:
    """Why `adapter`'s engine cannot start here. `installed_help(plan) -> (text, source) | None` gives the
    installed engine's --help (the dry run passes its cached one); None skips the flag check."""
    reasons = []
    plan = getattr(getattr(adapter, "server", None), "plan", None)
    command = (
        tuple(plan.command) if plan is not None else tuple(adapter.command()) if hasattr(adapter, "command") else ()
    )
    if command:
        executable = command[0]
        if not (shutil.which(executable) or os.access(executable, os.X_OK)):
            reasons.append(f"{executable} is not there (the interpreter or executable of {adapter.name}'s command)")
        elif plan is not None and not _installed(adapter):
            reasons.append(
                f"{adapter.name} is not installed for {executable}; point the cell's `python` setting "
                f"(or ${_python_variable(adapter)}) at the venv that has it"
            )
    served = getattr(adapter, "model_problem", None)
    problem = served() if served is not None else None
    if problem:
        reasons.append(problem)
    model = _local_model(adapter)
    if model is not None and not os.access(model, os.R_OK):
        reasons.append(f"model {model} is {'not readable' if model.exists() else 'not there'}")
    if not reasons and plan is not None and installed_help is not None and plan.help_command:
        found = installed_help(plan)
        if found is not None:
            text, _ = found
            reasons += [
                f"installed {adapter.name}: {problem}"
                for problem in command_problems(respell(plan.command, text, plan.spellings), text)
            ]
    return reasons


def installed_help(plan) -> tuple[str, str] | None:
    """The installed engine's --help and where it came from, or None when that engine is not installed here."""
    executable = plan.help_command[0]
    if not (shutil.which(executable) or Path(executable).exists()):
        return None
    try:
        code, text = plan.run_help()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if code != 0 or not help_flags(text):
        return None
    return text, f"installed: {shlex.join(plan.help_command)}"


def check_cells(
    config: ExperimentConfig, run_dir: Path, helps: dict[tuple[str, ...], tuple[str, str] | None] | None = None
) -> list[CellReadiness]:
    """Every engine cell's readiness (adapters are built, which checks their settings; nothing starts). With
    `helps` (a cache by help command, filled here: the launch reuses it), each distinct installed engine's
    --help is run once and the cell's flags are checked against it (vLLM's takes tens of seconds)."""

    def cached_help(plan):
        key = tuple(plan.help_command)
        if key not in helps:
            helps[key] = installed_help(plan)
        return helps[key]

    cells = []
    for engine in config.engines:
        adapter = engine_factory(engine.engine)(engine.settings, engine_dir(run_dir, engine.label))
        check = helps is not None and getattr(getattr(adapter, "settings", None), "check_flags", True)
        cells.append(CellReadiness(engine.label, tuple(start_problems(adapter, cached_help if check else None))))
    return cells


def require_all_can_start(cells: Sequence[CellReadiness]) -> None:
    """SettingsError (exit 2, before anything starts) naming every cell that cannot start and why."""
    blocked = [cell for cell in cells if not cell.ready]
    if blocked:
        listed = "; ".join(f"{cell.label}: {', '.join(cell.reasons)}" for cell in blocked)
        raise SettingsError(
            f"{len(blocked)} of {len(cells)} engine cells cannot start here ({listed}); fix them "
            "or remove those cells (`kvbench run CONFIG --dry-run` lists each)"
        )


# Adapters whose engine_version() lists several distributions, by the one that must be among them (LMCache runs
# in vLLM's interpreter: vLLM alone there is not enough).
_REQUIRED_DISTRIBUTION = {"lmcache": "lmcache"}


def _installed(adapter) -> bool:
    version = adapter.engine_version()
    required = _REQUIRED_DISTRIBUTION.get(adapter.name)
    return version is not None and (
        required is None or any(item.split()[0] == required for item in version.split(", "))
    )


def _python_variable(adapter) -> str:
    module = sys.modules.get(type(adapter).__module__)
    return getattr(module, "PYTHON_ENV", "KVBENCH_<ENGINE>_PYTHON")


def _local_model(adapter) -> Path | None:
    """The cell's model when it names a local path (absolute, ./, ../ or ~); None for a name or a hub id."""
    settings = getattr(adapter, "settings", None)
    model = getattr(settings, "model", None) or getattr(getattr(settings, "engine", None), "model", None)
    if not isinstance(model, str) or not model.startswith(("/", "./", "../", "~")):
        return None
    return Path(model).expanduser()
