"""ci/debian.sh, ci/test.sh's install step, against an `apt-get` that locks as apt 2.6.1 does (tests/ci/fake_apt.py),
while another process holds apt's locks the way apt itself takes them (an fcntl lock on each lock file) and lets
go after 30 s, as unattended-upgrades at a fresh machine's boot does. No package is installed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ci import fake_apt
from tests.paths import REPO

# Another apt: both locks taken at once, the lists' let go after LISTS s (its update done), dpkg's after DPKG s.
HOLDER = """
import fcntl, os, sys, time
lists, dpkg = (os.open(path, os.O_RDWR | os.O_CREAT, 0o640) for path in sys.argv[3:])
for fd in (lists, dpkg):
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(float(sys.argv[1]))
os.close(lists)
time.sleep(float(sys.argv[2]) - float(sys.argv[1]))
"""


def _apt_on_path(tmp_path: Path) -> dict[str, str]:
    """PATH with fake `apt-get` (and a `sudo` that runs its command, so that no real apt-get is reached)."""
    bin_dir, root = tmp_path / "bin", tmp_path / "apt"
    bin_dir.mkdir()
    for sub in ("lists", "dpkg"):
        (root / sub).mkdir(parents=True)
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\nexec {sys.executable} {fake_apt.__file__} "$@"\n')
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for tool in ("apt-get", "sudo"):
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_APT_ROOT": str(root)}


def _hold_locks(root: Path, lists_s: float, dpkg_s: float) -> subprocess.Popen:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(lists_s),
            str(dpkg_s),
            str(root / "lists" / "lock"),
            str(root / "dpkg" / "lock-frontend"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def _install(env: dict[str, str], timeout_s: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "ci" / "debian.sh"), "redis-server", "prometheus"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.mark.slow
def test_the_install_waits_for_another_apt_holding_its_locks_for_30_s(tmp_path):
    env = _apt_on_path(tmp_path)
    root = Path(env["FAKE_APT_ROOT"])
    holder = _hold_locks(root, 10, 30)  # update waits 10 s on the lists, install 20 s more on dpkg's lock
    started = time.monotonic()
    done = _install(env)
    waited = time.monotonic() - started
    holder.wait()
    assert done.returncode == 0, done.stderr
    assert waited >= 25  # it went through only once the other apt let go (the holder started ~1 s before)
    updates = fake_apt.calls("update", root)
    assert updates[-1] is True and updates.count(False) >= 1  # refused while held, then tried again
    assert fake_apt.calls("install", root) == [True]
    assert "locked by another apt; waiting" in done.stdout


def test_a_lock_held_past_the_limit_fails_with_apts_own_words(tmp_path):
    env = {**_apt_on_path(tmp_path), "KVBENCH_APT_LOCK_TIMEOUT": "1"}
    root = Path(env["FAKE_APT_ROOT"])
    holder = _hold_locks(root, 60, 60)
    try:
        done = _install(env)
    finally:
        holder.kill()
    assert done.returncode != 0
    assert f"Could not get lock {root / 'lists' / 'lock'}" in done.stderr
    assert fake_apt.calls("install", root) == []  # nothing installed on stale lists


def test_a_download_that_broke_off_is_tried_once_more(tmp_path):
    env = {**_apt_on_path(tmp_path), "FAKE_APT_FAILED_DOWNLOADS": "1"}
    done = _install(env)
    assert done.returncode == 0, done.stderr
    assert fake_apt.calls("install", Path(env["FAKE_APT_ROOT"])) == [False, True]
    assert "trying once more" in done.stdout


def test_two_broken_downloads_fail_the_install(tmp_path):
    env = {**_apt_on_path(tmp_path), "FAKE_APT_FAILED_DOWNLOADS": "2"}
    done = _install(env)
    assert done.returncode != 0 and "Failed to fetch" in done.stderr
    assert fake_apt.calls("install", Path(env["FAKE_APT_ROOT"])) == [False, False]
