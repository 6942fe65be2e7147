"""Shared test setup: OpenMP waits passively and does not spin first (`kvengine.settings.openmp` gives our engine's servers
a short spin; the tests keep every process, in-process engines and the servers they start, from spinning
against the other xdist worker's)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "0")


def pytest_collection_modifyitems(session, config, items):
    """Files with a test marked `long` (minutes: a real vLLM server) are collected first, the rest in their
    order. ci/test.sh runs pytest-xdist with `--dist loadfile --no-loadscope-reorder`, which hands files out in
    this order: each long file then starts at once on its own worker and the short files fill in around it,
    instead of a several-minute file starting late and running on alone at the end."""
    long_files = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in long_files)  # a stable sort: each group keeps its order
