"""An engine server run as a child process: launch, health wait with log tail, stop by process group.

The engine never outlives the driver: `stop()` ends its whole process group, and on Linux the kernel sends
it SIGTERM when the driver dies, even by SIGKILL (`PR_SET_PDEATHSIG`), so no engine is left holding its port
and memory under PID 1.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kvbench.engines.base import EngineError
from kvbench.engines.http import request

LOG_TAIL_LINES = 40
PID_LINE = "[kvbench] engine pid"  # the log line after the command line: `[kvbench] engine pid 1234`
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class ManagedProcess:
    """One server process. Its stdout and stderr go to `log_path`, which stays in the run folder."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | None = None,
        scrub_prefixes: Sequence[str] = (),
    ):
        self.command = list(command)
        self.env = dict(env)
        self.scrub_prefixes = tuple(scrub_prefixes)
        self.log_path = log_path
        self.cwd = cwd
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        log.write(f"$ {' '.join(self.command)}\n".encode())
        log.flush()
        try:
            self._process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_environment(os.environ, self.env, self.scrub_prefixes),
                cwd=self.cwd,
                start_new_session=True,  # its own process group, so stop() reaches its children too
                preexec_fn=dies_with_this_thread(),
            )
            log.write(f"{PID_LINE} {self._process.pid}\n".encode())
        except OSError as exc:
            raise EngineError(f"could not launch {self.command[0]!r}: {exc}") from None
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait_healthy(self, health_url: str, timeout_s: float) -> None:
        """Poll `health_url` until it answers 2xx; raise with the log tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not self.running:
                code = self._process.returncode if self._process else None
                raise EngineError(f"engine exited with code {code} before it was healthy\n{self.log_tail()}")
            reply = request("GET", health_url, timeout_s=2.0)
            if reply.ok:
                return
            last = reply.error or f"HTTP {reply.status}"
            time.sleep(0.5)
        raise EngineError(f"engine not healthy after {timeout_s:g} s ({health_url}: {last})\n{self.log_tail()}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {self.log_path})"
        return f"--- last {min(lines, len(text))} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `grace_s`; returns the exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        return process.returncode


def child_environment(
    parent: Mapping[str, str], env: Mapping[str, str], scrub_prefixes: Sequence[str] = ()
) -> dict[str, str]:
    """What a child sees: the parent's variables minus those starting with a scrubbed prefix, then `env` on top."""
    kept = {key: value for key, value in parent.items() if not key.startswith(tuple(scrub_prefixes))}
    return {**kept, **env}


def dies_with_this_thread() -> Callable[[], None] | None:
    """A `preexec_fn` asking Linux to SIGTERM the child when its parent dies; None elsewhere.

    The kernel watches the thread that forks, so engines are launched from the driver's main thread.
    `prctl` is looked up here, before the fork: the child only calls it.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except ProcessLookupError:
        pass
