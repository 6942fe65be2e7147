"""Shared test setup: one torch thread (two run slower than one on this 2-core CPU)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
