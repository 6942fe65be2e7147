"""The HTTP server's own Prometheus metrics, registered beside the engine's (one /metrics exposition).

- `kvbench:client_disconnects_total`: requests whose client left before the answer was written (normal traffic:
  one debug line each, never an ERROR).
- `kvbench:client_stalled_total`: streams ended because their client stopped reading (a write waited the
  server's stall timeout); their requests were aborted, their slots and pages freed.
- `kvbench:tokenize_queue_depth{lane}`: requests queued or running in a tokenizer lane (small, large).
- `kvbench:tokenize_rejected_total{lane}`: requests refused with 429 because their lane was full.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        labels = ["model_name"]
        self.disconnects = Counter(
            "kvbench:client_disconnects", "Requests whose client left before the answer", labels, registry=registry
        )
        self.stalled = Counter(
            "kvbench:client_stalled", "Streams ended because their client stopped reading", labels, registry=registry
        )
        self.queue_depth = Gauge(
            "kvbench:tokenize_queue_depth",
            "Requests queued or running in a tokenizer lane",
            labels + ["lane"],
            registry=registry,
        )
        self.rejected = Counter(
            "kvbench:tokenize_rejected",
            "Requests refused (429) because their tokenizer lane was full",
            labels + ["lane"],
            registry=registry,
        )

    def client_left(self) -> None:
        self.disconnects.labels(self.model_name).inc()

    def client_stalled(self) -> None:
        self.stalled.labels(self.model_name).inc()

    def lane_depth(self, lane: str, depth: int) -> None:
        self.queue_depth.labels(self.model_name, lane).set(depth)

    def lane_rejected(self, lane: str) -> None:
        self.rejected.labels(self.model_name, lane).inc()
