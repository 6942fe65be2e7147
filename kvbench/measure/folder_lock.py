"""The run folder's lock: one run writes a folder at a time.

`kvbench run` holds an exclusive `fcntl.flock` on RUN_DIR/.kvbench.lock while it writes the folder; the file
holds the holder's pid (for the refusal's message, and for a person looking). The kernel releases a flock when
its process exits, however it exits (a SIGKILL included), so a stale lock file never blocks a later run; the
file itself stays, emptied on a clean release (removing it would let a third run lock a file a second run has
already opened: two holders).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from kvbench.measure.run_folder import LOCK_FILE
from kvbench.measure.write_errors import writing
from kvbench.settings import SettingsError


class RunFolderLocked(SettingsError):
    """Another process is writing the run folder (bad input: the CLI exits 2 and names the holder)."""


@contextlib.contextmanager
def locked_run_dir(run_dir: Path) -> Iterator[Path]:
    """Hold `run_dir`'s lock (creating the folder) for the block; raise RunFolderLocked naming the holder's pid
    at once when another process holds it (no waiting: a run takes minutes to hours)."""
    path = run_dir / LOCK_FILE
    with writing(path):
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunFolderLocked(f"{run_dir} is being written by another kvbench run (pid {holder}, lock {path}); "
                              "wait for it to finish or give another --out") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the flock
