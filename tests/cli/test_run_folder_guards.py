"""The run folder under contention and on a failing disk: a second run on the same --out is refused while the
first writes it (two real processes), and an OS error writing it is one line, exit 1, records kept."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvbench.cli.main import main
from kvbench.measure.records import RecordWriter, read_records

from ..harness.instrument_fixture import instrument_process

SLOW = ("--first-token-ms", "30", "--chunk-interval-ms", "10")


def _driver(url: str, out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "run",
            "--url",
            url,
            "--num-sessions",
            "50",
            "--concurrency",
            "2",
            "--num-requests",
            "1000",
            "--out",
            str(out),
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(condition, driver: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert driver.poll() is None, f"kvbench run exited early ({driver.returncode}): {driver.stderr.read()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _records(out: Path) -> list:
    path = out / "requests.jsonl"
    return list(read_records(path)) if path.exists() else []


def test_a_second_run_on_the_same_folder_exits_2_naming_the_holder_and_resume_never_duplicates(tmp_path, capsys):
    out = tmp_path / "run"
    with instrument_process(*SLOW) as (url, _):
        first = _driver(url, out)
        try:
            _wait_for(lambda: len(_records(out)) >= 2, first)
            for flags in ([], ["--resume"], ["--overwrite"]):
                assert (
                    main(
                        [
                            "run",
                            "--url",
                            url,
                            "--num-sessions",
                            "50",
                            "--concurrency",
                            "2",
                            "--num-requests",
                            "1000",
                            "--out",
                            str(out),
                            *flags,
                        ]
                    )
                    == 2
                ), flags
                err = capsys.readouterr().err.strip()
                assert f"pid {first.pid}" in err and "another kvbench run" in err and "\n" not in err, err
            assert first.poll() is None  # the holder was left alone
        finally:
            first.send_signal(signal.SIGKILL)  # no clean release: the kernel drops the flock
            first.wait()
        kept = _records(out)
        assert kept
        # the holder is gone: a resume may take the folder, and adds only what was not finished
        assert main(
            [
                "run",
                "--url",
                url,
                "--num-sessions",
                "3",
                "--concurrency",
                "2",
                "--num-requests",
                "1000",
                "--out",
                str(out),
                "--resume",
            ]
        ) in (0, 2)
    identities = [record.identity for record in _records(out)]
    assert len(identities) == len(set(identities)), "a request recorded twice"


def test_two_resumes_at_once_cannot_both_write(tmp_path):
    out = tmp_path / "run"
    with instrument_process(*SLOW) as (url, _):
        first = _driver(url, out)
        try:
            _wait_for(lambda: len(_records(out)) >= 2, first)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        resumes = [_driver(url, out, "--resume") for _ in range(2)]
        try:
            _wait_for(
                lambda: any(driver.poll() is not None for driver in resumes),
                resumes[0] if resumes[1].poll() is not None else resumes[1],
            )
            refused = next(driver for driver in resumes if driver.poll() is not None)
            assert refused.returncode == 2 and "another kvbench run" in refused.stderr.read()
        finally:
            for driver in resumes:
                with contextlib.suppress(ProcessLookupError):
                    driver.send_signal(signal.SIGINT)
            for driver in resumes:
                driver.wait(timeout=60)
    identities = [record.identity for record in _records(out)]
    assert len(identities) == len(set(identities)), "a request recorded twice"


# --- OS errors writing the folder ---------------------------------------------------------------------------


@contextlib.contextmanager
def _mounted_tmpfs(path: Path, options: str):
    """A small tmpfs at `path` where this machine lets us mount one (root in a container), else None."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = (
        os.geteuid() == 0
        and subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode
        == 0
    )
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


class _FillingFile:
    """requests.jsonl's file as a disk with room for `room` records: the next write puts half its bytes down
    and fails with ENOSPC, as a full disk does."""

    def __init__(self, file, room: int) -> None:
        self._file, self._room = file, room

    def write(self, data) -> int:
        if self._room == 0:
            self._file.write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= 1
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)


def _disk_full_after(monkeypatch, room: int) -> None:
    real = RecordWriter.__init__

    def init(self, path):
        real(self, path)
        self._file = _FillingFile(self._file, room)

    monkeypatch.setattr(RecordWriter, "__init__", init)


def _run(url: str, out: Path) -> int:
    return main(["run", "--url", url, "--num-sessions", "6", "--concurrency", "2", "--out", str(out)])


def test_a_full_disk_is_one_line_exit_1_and_keeps_the_records_flushed(tmp_path, capsys, monkeypatch):
    # 16 KiB of tmpfs: config.yaml and env.json take a page each, requests.jsonl fills the rest mid-run
    with _mounted_tmpfs(tmp_path / "small", "size=16k") as disk, instrument_process() as (url, _):
        if disk is None:  # no tmpfs here: the same ENOSPC, injected after three records
            _disk_full_after(monkeypatch, 3)
            disk = tmp_path
        out = disk / "run"
        code = _run(url, out)
        err = capsys.readouterr().err.strip()
        assert code == 1
        assert "\n" not in err and "Traceback" not in err
        assert f"cannot write {out / 'requests.jsonl'}: No space left on device (ENOSPC)" in err, err
        lines = (out / "requests.jsonl").read_text().splitlines()
        assert lines and all(json.loads(line)["run_id"] for line in lines)  # every flushed record intact
        if (out / "summary.json").exists():  # where the disk allowed it, the summary of exactly those records
            (entry,) = json.loads((out / "summary.json").read_text())["runs"]
            assert entry["summary"]["overall"]["requests"] == len(lines)
            assert "could not be written" in entry["aborted"]


def test_a_failed_record_write_still_writes_the_summary_of_the_records_kept(tmp_path, capsys, monkeypatch):
    _disk_full_after(monkeypatch, 3)  # the records' file fills; the summary files (replaced whole) still fit
    out = tmp_path / "run"
    with instrument_process() as (url, _):
        assert _run(url, out) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: cannot write {out / 'requests.jsonl'}: No space left on device (ENOSPC)"
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["run_id"] for line in lines)  # the half-written fourth cut off
    (entry,) = json.loads((out / "summary.json").read_text())["runs"]
    assert entry["summary"]["overall"]["requests"] == 3 and entry["valid"] is False
    assert "No space left on device" in entry["aborted"]


def test_a_read_only_parent_is_one_line_exit_1(tmp_path, capsys):
    parent = tmp_path / "ro"
    with _mounted_tmpfs(parent, "ro,size=16k") as disk:
        if disk is None:
            if os.geteuid() == 0:
                pytest.skip("root ignores permissions and this machine mounts no tmpfs")
            parent.chmod(0o500)
        try:
            code = main(["run", "--url", "http://127.0.0.1:1", "--out", str(parent / "run")])
        finally:
            if disk is None:
                parent.chmod(0o700)
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err and "Traceback" not in err
    assert f"cannot write {parent / 'run'}" in err
    assert "Read-only file system (EROFS)" in err or "Permission denied (EACCES)" in err, err
