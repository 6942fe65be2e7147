"""Shared fixtures: the public traces, copied into tests/data/shared/traces (see tests/paths.py)."""

from pathlib import Path

import pytest

from kvbench.workloads.traces import read_azure, read_mooncake
from tests.paths import TRACES


def _require(path: Path) -> Path:
    assert path.is_file(), (
        f"public trace {path} is missing: tests/data/shared/ holds the copies (or set KVBENCH_SHARED_DIR)"
    )
    return path


@pytest.fixture(scope="session")
def mooncake_path() -> Path:
    return _require(TRACES / "mooncake" / "synthetic_trace.jsonl")


@pytest.fixture(scope="session")
def azure_conv_path() -> Path:
    return _require(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")


@pytest.fixture(scope="session")
def azure_code_path() -> Path:
    return _require(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")


@pytest.fixture(scope="session")
def mooncake_workload(mooncake_path):
    return read_mooncake(mooncake_path)


@pytest.fixture(scope="session")
def azure_conv_workload(azure_conv_path):
    return read_azure(azure_conv_path)
