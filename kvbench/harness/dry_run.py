"""`kvbench run CONFIG.yaml --dry-run`: what every cell of the matrix would launch and send, checked, with nothing
launched or written.

For each engine cell: the exact command line (each flag spelled as the help text in use lists it), the variables
the adapter sets (secret values masked) and the inherited ones it removes, the files it would write, and the load
plan of every point (sessions, requests, planned rate, expected duration). The flags are checked against the
installed engine's --help when it runs, else against the committed help text of every version the adapter
targets (`reference_help`; `reference_config` for the keys of a generated config file, e.g. LMCache's YAML).
A flag or key a version lacks is a problem naming both; `kvbench run` exits 2 on any.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvbench.engines.launch import command_problems, reference_dir, respell
from kvbench.engines.registry import engine_factory
from kvbench.harness.config import ExperimentConfig
from kvbench.harness.preflight import installed_help, start_problems
from kvbench.harness.stage_play import stage_sessions
from kvbench.measure.run_folder import engine_dir
from kvbench.measure.schedule import LoadSpec
from kvbench.measure.stages import StagedLoad
from kvbench.workloads.spec import Workload

MASK = "***"
# A name that ends in a secret's word: HF_TOKEN, --api-key, KVBENCH_ADMIN_KEY (not --max-num-batched-tokens).
_SECRET_NAME = re.compile(r"(^|[-_])(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(\w+://[^:/@\s]*:)[^@\s]+@")


def mask(text: str) -> str:
    """`text` with the password of any URL in it replaced (redis://:pw@host -> redis://:***@host)."""
    return _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables as shown: the value of a secret-looking name masked, URL passwords masked in the rest."""
    return {key: MASK if _SECRET_NAME.search(key) else mask(value) for key, value in env.items()}


def masked_command(command: Sequence[str]) -> list[str]:
    """The command as shown: the value after a secret-looking flag (--api-key X) masked, URL passwords masked."""
    out: list[str] = []
    for index, token in enumerate(command):
        name, sep, _ = token.partition("=")
        if name.startswith("--") and _SECRET_NAME.search(name) and sep:
            out.append(f"{name}={MASK}")
        elif (
            index
            and not token.startswith("--")
            and command[index - 1].startswith("--")
            and "=" not in command[index - 1]
            and _SECRET_NAME.search(command[index - 1])
        ):
            out.append(MASK)
        else:
            out.append(mask(token))
    return out


@dataclass(frozen=True)
class HelpCheck:
    """The command (or a generated file's keys) checked against one help text: which, from where, what it lacks."""

    version: str
    source: str
    problems: tuple[str, ...]


@dataclass(frozen=True)
class PointPlan:
    """One load point of one workload: what would be sent, and for about how long (None: the engine decides)."""

    workload: str
    sessions: int
    requests: int
    workload_requests: int
    load: str
    repeat: int
    expected_s: float | None
    how: str


@dataclass(frozen=True)
class CellPlan:
    """One engine cell of the matrix, as it would run."""

    label: str
    engine: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    scrubbed: tuple[str, ...]
    files: Mapping[str, str]
    checks: tuple[HelpCheck, ...]
    points: tuple[PointPlan, ...]
    note: str = ""
    cannot_start: tuple[str, ...] = ()  # why it cannot start on this machine (harness/preflight.py); empty: it can

    @property
    def problems(self) -> list[str]:
        return [f"{self.label}: {check.version}: {problem}" for check in self.checks for problem in check.problems]

    @property
    def expected_s(self) -> float:
        """Seconds of load of every point and repetition whose length is planned (a lower bound: see open_ended)."""
        return sum(point.expected_s * point.repeat for point in self.points if point.expected_s is not None)

    @property
    def open_ended(self) -> bool:
        """Some point (closed loop without duration_s) lasts as long as the engine takes."""
        return any(point.expected_s is None for point in self.points)


def budget_problem(cells: Sequence[CellPlan], budget_min: float) -> str | None:
    """Why the plan cannot fit `budget_min` minutes of one job (its cells one after another), or None."""
    total_min = sum(cell.expected_s for cell in cells) / 60
    if total_min <= budget_min:
        return None
    longest = max(cells, key=lambda cell: cell.expected_s)
    return (
        f"--budget {budget_min:g}: the plan needs at least ~{total_min:.1f} min of load over {len(cells)} cells "
        f"(the longest, {longest.label}, ~{longest.expected_s / 60:.0f} min); run the cells as separate jobs "
        "(ci/github-nightly.yml's GPU matrix), or lower stop.duration_s, loads or repeat"
    )


def plan_experiment(config: ExperimentConfig, run_dir: Path, use_installed: bool = True) -> list[CellPlan]:
    """Every cell's plan; adapters are built (which checks their settings), nothing is started or written."""
    helps: dict[tuple[str, ...], tuple[str, str] | None] = {}
    cells = []
    for engine in config.engines:
        adapter = engine_factory(engine.engine)(engine.settings, engine_dir(run_dir, engine.label))
        points = tuple(_points(config, spec, adapter) for spec in config.workloads)
        cell = _cell(
            engine.label, engine.engine, adapter, tuple(p for group in points for p in group), helps, use_installed
        )
        cells.append(dataclasses.replace(cell, cannot_start=tuple(start_problems(adapter))))
    return cells


def _cell(label: str, name: str, adapter, points: tuple[PointPlan, ...], helps: dict, use_installed: bool) -> CellPlan:
    server = getattr(adapter, "server", None)
    plan = getattr(server, "plan", None)
    if plan is None:
        command = tuple(adapter.command()) if hasattr(adapter, "command") else ()
        note = (
            "kvbench's own server: its flags are derived from its settings (no help text to check)"
            if command
            else f"nothing is launched: {name} measures a server that is already running"
        )
        return CellPlan(label, name, command, {}, (), {}, (), points, note)
    installed = None
    if use_installed and plan.help_command:
        key = tuple(plan.help_command)
        if key not in helps:
            helps[key] = installed_help(plan)
        installed = helps[key]
    checks: list[HelpCheck] = []
    if installed is not None:
        text, source = installed
        version = f"installed {adapter.engine_version() or '(version unknown)'}"
        command = respell(plan.command, text, plan.spellings)
        checks.append(HelpCheck(version, source, tuple(command_problems(command, text))))
    else:
        command = plan.command
        for index, (version, file_name) in enumerate(adapter.reference_help.items()):
            path = reference_dir() / file_name
            if not path.exists():
                checks.append(HelpCheck(version, f"committed {path}", (f"committed help text {path} is missing",)))
                continue
            text = path.read_text()
            spelled = respell(plan.command, text, plan.spellings)
            if index == 0:
                command = spelled  # shown as the first targeted version spells it
            checks.append(HelpCheck(version, f"committed {path}", tuple(command_problems(spelled, text))))
    for file_name, references in adapter.reference_config.items():
        keys = set((yaml.safe_load(plan.files.get(file_name, "")) or {}).keys())
        for version, reference in references.items():
            known = _reference_keys(reference_dir() / reference)
            checks.append(
                HelpCheck(
                    f"{version} ({file_name} keys)",
                    f"committed {reference_dir() / reference}",
                    tuple(f"unknown key {key}" for key in sorted(keys - known)),
                )
            )
    return CellPlan(
        label,
        name,
        tuple(command),
        masked_env(plan.env),
        tuple(plan.scrub_env_prefixes),
        {file: mask(text) for file, text in plan.files.items()},
        tuple(checks),
        points,
    )


def _reference_keys(path: Path) -> set[str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return {line.split("\t")[0] for line in lines if line.strip() and not line.startswith("#")}


def _points(config: ExperimentConfig, spec, adapter) -> list[PointPlan]:
    workload = spec.load(config.seed, getattr(adapter, "vocab_size", None))
    return [_point(workload, load, config.repeat) for load in config.load_specs()]


def _point(workload: Workload, load: LoadSpec, repeat: int) -> PointPlan:
    if load.stage is not None:
        return _stage_point(workload, load.stage, repeat)
    total = workload.num_requests
    requests = min(total, load.num_requests or total)
    sends = planned_sends(workload, load.rate)[:requests]
    if load.duration_s is not None and load.concurrency is None:
        sends = [send for send in sends if send[0] <= load.duration_s] or sends[:1]  # none is sent after duration_s
        requests = len(sends)
    sessions = len({session for _, session in sends})
    if load.rate is not None:
        label = f"rate {load.rate:g} sessions/s" + (
            f" (burstiness {load.burstiness:g})" if load.burstiness != 1 else ""
        )
        expected = sends[-1][0]
        how = (
            f"~{expected / 60:.0f} min until the last request is sent (sessions arriving every "
            f"{1 / load.rate:g} s on average, turns after their think times; answers' own time not counted)"
        )
    elif load.request_rate is not None:
        label = f"request rate {load.request_rate:g} requests/s" + (
            f" (burstiness {load.burstiness:g})" if load.burstiness != 1 else ""
        )
        expected = requests / load.request_rate if requests else None
        how = (
            f"~{expected / 60:.0f} min until the last request is sent (arrivals every {1 / load.request_rate:g} s "
            f"on average, sessions opened as the rate needs them)"
            if expected
            else "every request as soon as it is ready: as long as the engine takes to answer them"
        )
    elif load.concurrency is not None:
        label, expected = f"concurrency {load.concurrency}", None
        how = "closed loop: as long as the engine takes to answer them"
    else:
        label = "the workload's own arrival times"
        expected = sends[-1][0]
        how = f"~{expected / 60:.0f} min until the last request is sent (recorded arrivals and think times)"
    if load.max_concurrency is not None:
        label += f", at most {load.max_concurrency} in flight"
    if load.duration_s is not None:
        expected = load.duration_s if expected is None else min(expected, load.duration_s)
        how += f"; sending stops at {load.duration_s:g} s" + ("" if load.concurrency is None else " at the latest")
    return PointPlan(workload.name, sessions, requests, total, label, repeat, expected, how)


def _stage_point(workload: Workload, staged: StagedLoad, repeat: int) -> PointPlan:
    """A stage's point: its sessions (the first stage's warm-up too) at the stage's Poisson rate, for its seconds."""
    parts = staged.parts(seed=0)  # what is sent and for how long do not depend on the seed
    sessions = stage_sessions(workload, staged)
    gaps = (len(parts) - 1 + staged.keeps_cache) * staged.plan.gap_s
    expected = sum(part.stage.duration_s for part in parts) + gaps
    warmup = [part.stage.label for part in parts if part.warmup]
    label = f"stage {staged.stage.label} (Poisson)" + (f" after the warm-up {warmup[0]}" if warmup else "")
    how = (
        f"~{expected:g} s: the stages' seconds, each drained before the next, and {staged.plan.gap_s:g} s between "
        "(answers' own time not counted); "
        + ("the cache of the stage before kept" if staged.keeps_cache else "the cache reset first")
    )
    return PointPlan(
        workload.name,
        len(sessions),
        sum(len(session.turns) for session in sessions),
        workload.num_requests,
        label,
        repeat,
        expected,
        how,
    )


def planned_sends(workload: Workload, rate: float | None) -> list[tuple[float, int]]:
    """(send time, session index) of every request in send order, if answers took no time: session i arrives at
    i / rate (the mean of the Poisson schedule) or at its recorded time, and each turn follows the previous one by
    its think time. The n-th time is a lower bound on when the n-th request goes out."""
    sends = []
    for index, session in enumerate(workload.sessions):
        at = index / rate if rate is not None else session.arrival_s
        for turn in session.turns:
            at += turn.think_time_s
            sends.append((at, index))
    return sorted(sends)


def format_plan(cells: Sequence[CellPlan]) -> str:
    """The plan as text: one block per cell."""
    lines: list[str] = []
    for number, cell in enumerate(cells, 1):
        lines.append(f"== cell {number}/{len(cells)}: {cell.label} ({cell.engine}) ==")
        lines += [f"cannot start here: {reason}" for reason in cell.cannot_start]
        if cell.note:
            lines.append(cell.note)
        for check in cell.checks:
            verdict = "ok" if not check.problems else "; ".join(check.problems)
            lines.append(f"checked against {check.version} [{check.source}]: {verdict}")
        if cell.command:
            lines.append("command:")
            lines.append("  " + shlex.join(masked_command(cell.command)))
        if cell.env or cell.scrubbed:
            lines.append("environment (the driver's, plus these):")
            lines += [f"  {key}={value}" for key, value in cell.env.items()]
            if cell.scrubbed:
                lines.append(f"  removed from the inherited environment: {', '.join(p + '*' for p in cell.scrubbed)}")
        for file_name, text in cell.files.items():
            lines.append(f"file {file_name}:")
            lines += [f"  {line}" for line in text.rstrip().splitlines()]
        lines.append("load plan:")
        for point in cell.points:
            lines.append(
                f"  {point.workload}: {point.sessions} sessions, {point.requests} requests (of "
                f"{point.workload_requests} in the workload) at {point.load}, x{point.repeat}: {point.how}"
            )
        lines.append(
            f"  expected: {_estimate(cell.expected_s, cell.open_ended)}, plus the engine's start "
            "(and a restart per point for restart_to_reset)"
        )
        lines.append("")
    if cells:
        lines.append(f"== expected duration per cell ({len(cells)} cells) ==")
        width = max(len(cell.label) for cell in cells)
        lines += [f"  {cell.label:<{width}}  {_estimate(cell.expected_s, cell.open_ended)}" for cell in cells]
        total = sum(cell.expected_s for cell in cells)
        lines.append(
            f"  {'total':<{width}}  {_estimate(total, any(cell.open_ended for cell in cells))}, one cell "
            "after another (with --ray, cells run in parallel on free nodes)"
        )
    blocked = sum(1 for cell in cells if cell.cannot_start)
    lines.append(
        f"{blocked} of {len(cells)} cells cannot start here"
        + (" (see 'cannot start here' above; kvbench run refuses the config until they can)" if blocked else "")
    )
    return "\n".join(lines)


def _estimate(seconds: float, open_ended: bool) -> str:
    size = f"~{seconds / 60:.0f} min" if seconds >= 60 else f"~{seconds:.0f} s"
    return f"at least {size} of load" + (" plus the closed-loop points" if open_ended else "")


def print_dry_run(
    config: ExperimentConfig, run_dir: Path, console, error_console, budget_min: float | None = None
) -> int:
    """`kvbench run --dry-run`: print the plan; 2 when a targeted version lacks a flag or key, or the plan's
    load cannot fit `budget_min` minutes, else 0 (cells that cannot start on this machine are a plan's fact, not
    an error: each says why, and a last line counts them)."""
    cells = plan_experiment(config, run_dir)
    console.print(format_plan(cells), markup=False, highlight=False, soft_wrap=True)
    problems = [f"{problem} (fix the setting or extra_args)" for cell in cells for problem in cell.problems]
    over = budget_problem(cells, budget_min) if budget_min is not None else None
    for problem in problems + ([over] if over else []):
        error_console.print(f"error: {problem}", markup=False, highlight=False)
    return 2 if problems or over else 0
