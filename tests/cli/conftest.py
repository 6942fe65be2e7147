"""Off a terminal the console tables honour COLUMNS (cli/tables.py) and are 200 wide without it; pytest-xdist's
workers set COLUMNS to their own terminal's width, so the tests that read a table's titles on one line pin the
pipe's case (a test of COLUMNS itself sets it again)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _pipe_without_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
