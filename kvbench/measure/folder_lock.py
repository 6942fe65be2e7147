"""The run folder's lock: one run writes a folder at a time.

`kvbench run` holds an exclusive `fcntl.flock` on RUN_DIR/.kvbench.lock while it writes the folder; the file
holds the holder's pid (for the refusal's message, and for a person looking; best effort: a full disk must
not stop the run). Released on every exit of the block, an exception or ENOSPC included: the holder removes the
file, then closes it. The kernel releases a flock when its process exits however it exits (a SIGKILL
included), so a file left by a killed run is provably stale: nobody holds it, and the next run takes it over.

Removing the file is safe because a taker checks, once it holds the flock, that the path still names the file
it locked (same inode); a run that opened the file just before the holder removed it finds it gone and opens
the new one, so two runs never hold the folder at once. (Before, the file was only emptied: a run stopped
by ENOSPC left it behind.)
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
    fd = _take(path, run_dir)
    try:
        with contextlib.suppress(OSError):  # the pid is for messages; ENOSPC here must not stop the run
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a run that opened it meanwhile sees it gone and retries
        os.close(fd)  # releases the flock


def _take(path: Path, run_dir: Path) -> int:
    """An fd of `path` holding its flock, the path still naming it; RunFolderLocked when another run holds it."""
    while True:
        with writing(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderLocked(
                f"{run_dir} is being written by another kvbench run (pid {holder}, lock {path}); "
                "wait for it to finish or give another --out"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        os.close(fd)  # its holder removed it as we opened it: take the path's file now
