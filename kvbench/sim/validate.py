"""Validation of the simulator against a real run of our engine: replay the run, compare what both measured.

A real run's records fix what the simulator must reproduce: which requests were sent, in which order
(`send_order`). Replayed in that order against the same cache size and step budget, the simulator runs the
same core on the same prompts, so its cache decisions match the engine's; its timings come from the cost
model, whose hardware profile `kvbench sim calibrate` fits to the engine's measured steps.
"""

from __future__ import annotations

from typing import Iterable

from kvbench.harness.records import RequestRecord


def send_order(records: Iterable[RequestRecord]) -> list[str]:
    """Request ids in the order the load generator sent them (requests never sent are left out)."""
    sent = [r for r in records if r.sent_ns is not None]
    return [r.request_id for r in sorted(sent, key=lambda r: (r.sent_ns, r.request_id))]
