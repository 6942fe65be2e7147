"""A run folder's file that could not be written (disk full, read-only file system, no permission).

Every writer of the run folder (records, summaries, config, plots) turns the OS error into `RunWriteError`,
which names the file and the error in one line: `kvbench run` prints it and exits 1, after writing the
summary of the records flushed so far where the disk still allows. It is deliberately not an OSError, so that
the network code's `except OSError` (a dropped connection is a failed request) cannot swallow it.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path


class RunWriteError(Exception):
    """Writing `path` failed with `error`."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(path, error)
        self.path, self.error = path, error

    def __str__(self) -> str:
        code = errno.errorcode.get(self.error.errno or 0)
        reason = self.error.strerror or str(self.error)
        return f"cannot write {self.path}: {reason}" + (f" ({code})" if code else "")


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError raised in the block into RunWriteError naming `path` (the error's own file name when
    it has one: a rename names both)."""
    try:
        yield
    except OSError as exc:
        raise RunWriteError(Path(exc.filename) if exc.filename else path, exc) from None
