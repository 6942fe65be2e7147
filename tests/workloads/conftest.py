"""Shared fixtures: the public traces under /work/shared/traces (skipped where that folder is absent)."""

from pathlib import Path

import pytest

from kvbench.workloads.traces import read_azure, read_mooncake

TRACES = Path("/work/shared/traces")


def _require(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"public trace {path} is not on this machine")
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
