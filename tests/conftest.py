"""Shared test setup: OpenMP waits passively (two busy-waiting torch threads run slower than one here)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
