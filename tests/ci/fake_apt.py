"""A stand-in for `apt-get` that locks as apt 2.6.1 does, so that ci/debian.sh can be tested under a held lock with
no package installed. Measured on this project's Debian 12 machines with the real lock files held by another
process's fcntl lock (the kind apt takes; util-linux `flock` takes a different kind, which apt does not see):
- `apt-get update` takes `<lists>/lock` and, when it is held, fails at once (exit 100) even with
  `-o DPkg::Lock::Timeout=S`: "E: Could not get lock /var/lib/apt/lists/lock. It is held by process N (python3)";
- `apt-get install -o DPkg::Lock::Timeout=S` waits up to S seconds for `<dpkg>/lock-frontend`, then fails as
  update does; without the option it fails at once.
Its lock files live under $FAKE_APT_ROOT; the first $FAKE_APT_FAILED_DOWNLOADS installs fail as a download that
broke off does. Each call is a line of $FAKE_APT_ROOT/calls.jsonl: the verb and whether it went through."""

import fcntl
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(os.environ.get("FAKE_APT_ROOT", "."))
LISTS_LOCK = ROOT / "lists" / "lock"
FRONTEND_LOCK = ROOT / "dpkg" / "lock-frontend"


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    options, rest, args = {}, [], iter(argv)
    for arg in args:
        if arg == "-o":
            key, _, value = next(args).partition("=")
            options[key.lower()] = value
        else:
            rest.append(arg)
    return options, rest


def _lock(path: Path, timeout_s: float) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True  # held until this process exits, as apt holds it
        except OSError:
            if time.monotonic() >= deadline:
                print(f"E: Could not get lock {path}. It is held by another process", file=sys.stderr)
                return False
            time.sleep(0.5)


def calls(verb: str, root: Path = ROOT) -> list[bool]:
    """Whether each earlier call of `verb` went through, in order."""
    path = root / "calls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry["ok"] for entry in map(json.loads, lines) if entry["verb"] == verb]


def _record(verb: str, ok: bool) -> None:
    with open(ROOT / "calls.jsonl", "a") as calls:
        calls.write(json.dumps({"verb": verb, "ok": ok}) + "\n")


def main() -> int:
    options, rest = _options(sys.argv[1:])
    verb = rest[0]
    if verb == "update":
        ok = _lock(LISTS_LOCK, 0.0)
    else:
        ok = _lock(FRONTEND_LOCK, float(options.get("dpkg::lock::timeout", "0")))
        if ok and len(calls("install")) < int(os.environ.get("FAKE_APT_FAILED_DOWNLOADS", "0")):
            print(
                "E: Failed to fetch http://deb.debian.org/debian/pool/main/r/redis/redis-server.deb  "
                "Connection timed out",
                file=sys.stderr,
            )
            ok = False
    _record(verb, ok)
    return 0 if ok else 100


if __name__ == "__main__":
    sys.exit(main())
