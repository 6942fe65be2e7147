"""The run folder's lock is released after any exit, or provably stale and taken over (issue 46: a run
stopped by ENOSPC left `.kvbench.lock` behind)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from kvbench.measure import folder_lock
from kvbench.measure.folder_lock import RunFolderLocked, locked_run_dir
from kvbench.measure.run_folder import LOCK_FILE


def test_a_second_run_is_refused_naming_the_holder_and_a_clean_release_leaves_no_file(tmp_path):
    with locked_run_dir(tmp_path / "run") as lock:
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(RunFolderLocked, match=f"pid {os.getpid()}"):
            with locked_run_dir(tmp_path / "run"):
                pass
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_a_run_stopped_by_enospc_releases_the_lock(tmp_path, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(folder_lock.os, "pwrite", full)  # even the pid cannot be written
    with pytest.raises(OSError, match="No space left"):
        with locked_run_dir(tmp_path / "run"):
            raise OSError(errno.ENOSPC, "No space left on device")  # the run's own write, mid-run
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    with locked_run_dir(tmp_path / "run"):  # and the next run takes the folder
        pass


def test_the_lock_of_a_killed_run_is_stale_and_taken_over(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from pathlib import Path; from kvbench.measure.folder_lock import locked_run_dir\n"
                f"with locked_run_dir(Path({str(run)!r})):\n    print('held', flush=True); time.sleep(600)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderLocked, match=f"pid {holder.pid}"):
            with locked_run_dir(run):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert (run / LOCK_FILE).read_text().strip() == str(holder.pid)  # left behind by the kill, held by nobody
    with locked_run_dir(run) as lock:
        assert lock.read_text().strip() == str(os.getpid())
    assert not (run / LOCK_FILE).exists()


def test_a_run_that_opened_the_file_as_its_holder_removed_it_takes_the_new_one(tmp_path, monkeypatch):
    """The race removing the file opens: the taker locks the old, removed file, sees that the path now names
    another (or none), and takes the path's own, so that two runs never hold the folder together."""
    run = tmp_path / "run"
    run.mkdir()
    opened = []
    real_open = os.open

    def open_then_holder_leaves(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if not opened:
            os.unlink(path)  # the holder's release, between our open and our flock
        opened.append(fd)
        return fd

    monkeypatch.setattr(folder_lock.os, "open", open_then_holder_leaves)
    with locked_run_dir(run) as lock:
        assert len(opened) == 2 and lock.exists()
        assert os.stat(lock).st_ino == os.fstat(opened[1]).st_ino
