"""What every adapter that launches an OpenAI-compatible server shares: the launch plan, the flag check against
the installed engine's `--help`, the process, the cache-reset call, the cold-cache probe and the /metrics scrape.

An adapter builds a `LaunchPlan` (pure: command, environment, generated files) from its settings, and hands it to
a `LaunchedServer`, which carries it out in the adapter's folder:

    start()         write the plan's files, check its flags against `--help` (saved as engine-help.txt) and use
                    each flag's spelling that help lists, launch with the inherited environment minus the
                    variables the plan scrubs
    wait_healthy()  poll the health path; on failure raise with the log tail
    reset(path)     POST the engine's reset path, then (optionally) prove the cache is cold with a probe request
    scrape()        GET the metrics path, parsed with prometheus-client's parser
    stop()          SIGTERM to the process group, SIGKILL after a grace period
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from kvbench.engines.base import Endpoint, EngineError
from kvbench.engines.http import HttpReply, request
from kvbench.engines.process import ManagedProcess, child_environment
from kvbench.engines.prometheus import parse_samples

RESET_BACKOFF_S = (0.1, 5.0)  # first wait, longest wait between attempts of a refused cache reset

HELP_FILE = "engine-help.txt"
LOG_FILE = "engine.log"
HELP_TIMEOUT_S = 180.0  # vLLM's --help imports torch and every model module: tens of seconds on 2 cores
PROBE_LENGTH = 512  # >= 2 pages of any engine's page size (vLLM CPU pages are 128 tokens), so a hit is visible

_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one engine server; built by an adapter, pure data (tests read it offline).

    `files` maps a file name inside the adapter's folder to its text (written before launch); `help_command`
    prints the installed engine's --help, which every flag of `command` must appear in. `spellings` maps a flag
    of `command` to other names versions give it (vLLM 0.33 lists `--disable-prefix-caching` where 0.32 lists
    `--no-enable-prefix-caching`): the first name the help text lists is used. `scrub_env_prefixes` names
    inherited variables the child must not see (LMCache reads `LMCACHE_*` over its config file); `env` is set
    on top.
    """

    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    help_command: tuple[str, ...] | None = None
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"
    spellings: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    scrub_env_prefixes: tuple[str, ...] = ()

    def environment(self, parent: Mapping[str, str]) -> dict[str, str]:
        """The child's whole environment, given the driver's."""
        return child_environment(parent, self.env, self.scrub_env_prefixes)

    def run_help(self) -> tuple[int, str]:
        """Run `help_command` as the engine would be run: (exit code, its stdout + stderr). OSError or
        subprocess.TimeoutExpired (after HELP_TIMEOUT_S) when it cannot."""
        assert self.help_command is not None
        done = subprocess.run(
            list(self.help_command),
            capture_output=True,
            text=True,
            timeout=HELP_TIMEOUT_S,
            env=self.environment(os.environ),
        )
        return done.returncode, done.stdout + done.stderr


def reference_dir() -> Path:
    """Where the committed help texts live: $KVBENCH_SHARED_DIR/reference, else the repository's
    tests/data/shared/reference (kvbench is installed from its clone)."""
    shared = os.environ.get("KVBENCH_SHARED_DIR")
    return (
        Path(shared) / "reference"
        if shared
        else Path(__file__).resolve().parents[2] / "tests" / "data" / "shared" / "reference"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def help_flags(help_text: str) -> frozenset[str]:
    """Every `--flag` an argparse/click help text mentions (usage lines and option lists alike)."""
    return frozenset(_FLAG.findall(help_text))


# The ways help texts list a flag's choices: argparse `--f {a,b}`, vLLM 0.33 `--f ['a', 'b']`, click `--f [a|b]`.
_CHOICES = (r"[ =]\{([^}]*)\}", r" \[('[^\]]*')\]", r" \[([\w.-]+(?:\|[\w.-]+)+)\]")


def help_choices(help_text: str, flag: str) -> frozenset[str] | None:
    """The choices the help text lists right after `flag`, or None when it lists none."""
    for pattern in _CHOICES:
        found = re.search(re.escape(flag) + pattern, help_text)
        if found:
            return frozenset(choice.strip().strip("'") for choice in re.split(r"[,|]", found.group(1)))
    return None


def respell(command: Sequence[str], help_text: str, spellings: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """`command` with each flag that has other spellings replaced by the first of them `help_text` lists
    (unchanged when the help lists the flag itself, or none of them)."""
    known = help_flags(help_text)
    out = []
    for token in command:
        name, sep, value = token.partition("=")
        if name in spellings and name not in known:
            name = next((other for other in spellings[name] if other in known), name)
        out.append(name + sep + value)
    return tuple(out)


def command_flags(command: Sequence[str]) -> list[str]:
    """The flags a command line uses (`--a=b` counts as `--a`), in order."""
    return [token.split("=", 1)[0] for token in command if token.startswith("--") and len(token) > 2]


def command_problems(command: Sequence[str], help_text: str) -> list[str]:
    """Flags of `command` that `help_text` does not know, and values outside a flag's listed choices."""
    known = help_flags(help_text)
    problems = [f"unknown flag {flag}" for flag in command_flags(command) if flag not in known]
    for index, token in enumerate(command[:-1]):
        if not token.startswith("--") or "=" in token:
            continue
        choices = help_choices(help_text, token)
        value = command[index + 1]
        if choices is not None and not value.startswith("--") and value not in choices:
            problems.append(f"{token} {value!r} is not one of {{{','.join(sorted(choices))}}}")
    return problems


@dataclass(frozen=True)
class ProbeResult:
    """The cold-cache probe's answer: cached prompt tokens the engine reported (None: it reported none)."""

    prompt_tokens: int | None
    cached_tokens: int | None


def probe_tokens(length: int = PROBE_LENGTH, vocab_size: int = 32000) -> list[int]:
    """A fixed, deterministic prompt used only by the cold-cache probe (ids spread over the vocabulary)."""
    span = max(vocab_size - 200, 2)
    return [100 + (7919 * index + 13) % span for index in range(length)]


def probe_for(max_model_len: int | None, vocab_size: int | None) -> list[int]:
    """The probe prompt sized to fit the model's context (leaving room for the output token)."""
    length = PROBE_LENGTH if max_model_len is None else max(1, min(PROBE_LENGTH, max_model_len - 2))
    return probe_tokens(length, vocab_size or 32000)


def send_probe(base_url: str, model: str, tokens: Sequence[int], api_key: str | None = None) -> ProbeResult:
    """One /v1/completions request of `tokens` for 1 output token; returns what usage says about the cache."""
    body = {"model": model, "prompt": list(tokens), "max_tokens": 1, "temperature": 0.0}
    reply = request("POST", base_url + "/v1/completions", timeout_s=120, api_key=api_key, json_body=body)
    if not reply.ok:
        raise EngineError(f"cold-cache probe failed: {reply.error or ''} HTTP {reply.status} {reply.body[:300]!r}")
    try:
        usage = json.loads(reply.body).get("usage") or {}
    except ValueError as exc:
        raise EngineError(f"cold-cache probe failed: {exc}") from None
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", usage.get("cached_tokens"))
    return ProbeResult(usage.get("prompt_tokens"), None if cached is None else int(cached))


class LaunchedServer:
    """One launched engine server in `workdir` (log: engine.log, flags check: engine-help.txt)."""

    def __init__(self, plan: LaunchPlan, workdir: Path, port: int, check_flags: bool = True) -> None:
        self.plan = plan
        self.workdir = workdir
        self.port = port
        self.check_flags = check_flags
        self._process = ManagedProcess(
            plan.command, plan.env, workdir / LOG_FILE, scrub_prefixes=plan.scrub_env_prefixes
        )
        self._probe_sent = False
        # The installed engine's --help: given by a caller that already ran it (kvbench run's preflight, an eval's
        # previous KV setting), else run at start() and kept here (vLLM's takes ~20 s: it is run once per engine).
        self.help_text: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name, text in self.plan.files.items():
            (self.workdir / name).write_text(text)
        if self.check_flags and self.plan.help_command:
            self._check_against_help(self.plan.help_command)
        self._process.start()

    def _check_against_help(self, help_command: Sequence[str]) -> None:
        """Flags drift between versions: refuse to launch a command the installed engine would reject."""
        try:
            code, text = (0, self.help_text) if self.help_text else self.plan.run_help()
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineError(f"could not run {' '.join(help_command)!r}: {exc}") from None
        (self.workdir / HELP_FILE).write_text(text)
        if code != 0 or not help_flags(text):
            tail = "\n".join(text.splitlines()[-15:])
            raise EngineError(
                f"{' '.join(help_command)!r} failed (exit {code}); is the engine installed "
                f"for that interpreter? (set check_flags=false to skip this check)\n{tail}"
            )
        self.help_text = text
        command = respell(self.plan.command, text, self.plan.spellings)
        self._process.command = list(command)
        problems = command_problems(command, text)
        if problems:
            raise EngineError(
                f"the installed engine rejects this command ({'; '.join(problems)}); its --help is in "
                f"{self.workdir / HELP_FILE}. Fix the setting or extra_args, or set check_flags=false"
            )

    def wait_healthy(self, timeout_s: float) -> None:
        self._process.wait_healthy(self.base_url + self.plan.health_path, timeout_s)

    def post(self, path: str, timeout_s: float = 60.0) -> HttpReply:
        """POST `path`; a non-2xx answer raises, a 2xx one is returned (some engines say more in the body)."""
        return self._accepted(path, request("POST", self.base_url + path, timeout_s=timeout_s))

    def _accepted(self, path: str, reply: HttpReply) -> HttpReply:
        """`reply` when it is 2xx; else the one error that names the POST, the answer and the engine's log tail."""
        if not reply.ok:
            raise EngineError(
                f"POST {path} failed: {reply.error or reply.status} {reply.body[:200]}\n{self.log_tail()}"
            )
        return reply

    def post_until_accepted(self, path: str, timeout_s: float, refusal: Callable[[HttpReply], str | None]) -> HttpReply:
        """POST `path` until the engine accepts it. `refusal(reply)` says why a reply is a refusal worth retrying
        (the engine is busy: blocks held, requests running), or None when it is accepted; any other non-2xx
        answer raises at once. Retries back off from RESET_BACKOFF_S[0] to RESET_BACKOFF_S[1] seconds and give
        up with one clear error after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        wait, longest = RESET_BACKOFF_S
        attempts = 0
        while True:
            reply = request("POST", self.base_url + path, timeout_s=60.0)
            attempts += 1
            reason = refusal(reply)
            if reason is None:
                return self._accepted(path, reply)
            if time.monotonic() + wait > deadline:
                raise EngineError(
                    f"POST {path}: the engine refused {attempts} times over {timeout_s:g} s ({reason}); "
                    f"raise reset_timeout_s or let the previous load drain\n{self.log_tail()}"
                )
            time.sleep(wait)
            wait = min(wait * 2, longest)

    def verify_cold(self, model: str, tokens: Sequence[int]) -> ProbeResult:
        """Send the fixed probe prompt; after a reset it must find nothing cached.

        The same probe was sent after the previous reset, so a reset that silently kept the cache shows up here as
        cached tokens > 0. The probe's own pages stay behind; they share no prefix with any workload prompt.
        """
        result = send_probe(self.base_url, model, tokens)
        if result.cached_tokens and self._probe_sent:
            raise EngineError(
                f"cache reset did not empty the prefix cache: the probe prompt found "
                f"{result.cached_tokens} cached tokens (set verify_cold=false to run warm)"
            )
        self._probe_sent = True
        return result

    def scrape(self) -> dict[str, float] | None:
        if not self.plan.metrics_path:
            return None
        reply = request("GET", self.base_url + self.plan.metrics_path, timeout_s=10.0)
        return parse_samples(reply.body) if reply.ok else None

    def log_tail(self) -> str:
        return self._process.log_tail()

    def stop(self) -> None:
        self._process.stop()


def installed_version(python: str, distributions: Sequence[str]) -> str | None:
    """`name version` of each of `distributions` installed for interpreter `python` (comma-joined), or None."""
    script = (
        "import importlib.metadata as m, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try: print(name, m.version(name))\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    try:
        done = subprocess.run([python, "-c", script, *distributions], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ", ".join(done.stdout.split("\n")).strip(", ") or None


def optional_flags(values: Mapping[str, object], text: Callable[[object], str] = str) -> list[str]:
    """`[flag, text(value)]` for each flag whose value is set (None: leave the server's default), in order."""
    return [part for flag, value in values.items() if value is not None for part in (flag, text(value))]


def kv_dtype_label(kv_cache_dtype: str, dtype: str | None) -> str:
    """How result tables name an engine's KV dtype: the setting, or what `auto` resolves to."""
    return kv_cache_dtype if kv_cache_dtype != "auto" else f"auto ({dtype or 'model dtype'})"


class LaunchedAdapter:
    """What every adapter of a launched OpenAI-compatible server shares (vLLM, LMCache, SGLang, TensorRT-LLM).

    A subclass builds `self.settings` (with `vocab_size` and `verify_cold`) and `self.server` in its
    constructor, and supplies `name`, `capabilities`, `describe()`, `reset_cache()` and `engine_version()`.
    `reference_help` maps each version it targets to its committed --help text (a file name in
    `reference_dir()`); `reference_config` maps a generated file to {version: committed list of its keys}.
    """

    server: LaunchedServer
    settings: object
    reference_help: Mapping[str, str] = MappingProxyType({})
    reference_config: Mapping[str, Mapping[str, str]] = MappingProxyType({})
    _version: str | None = None

    @property
    def served_model(self) -> str:
        return self.settings.served_model_name

    @property
    def vocab_size(self) -> int | None:
        return self.settings.vocab_size

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.server.base_url, self.served_model)

    def engine_version(self) -> str | None:
        raise NotImplementedError

    def start(self) -> None:
        self._version = self.engine_version()
        self.server.start()

    def wait_healthy(self, timeout_s: float) -> None:
        self.server.wait_healthy(timeout_s)

    def scrape_metrics(self) -> Mapping[str, float] | None:
        return self.server.scrape()

    def stop(self) -> None:
        self.server.stop()

    def verify_cold(self, context_length: int | None) -> bool:
        """After a reset: the fixed probe must find nothing cached (unless `verify_cold` is off)."""
        if self.settings.verify_cold:
            self.server.verify_cold(self.served_model, probe_for(context_length, self.settings.vocab_size))
        return True
