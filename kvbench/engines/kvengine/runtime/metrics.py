"""The engine's Prometheus metrics, in a registry of its own (no global state), named `kvbench:*`.

Counters are cumulative since start, as vLLM's and SGLang's are; kvbench reads run deltas. The cached-token
counter counts exactly what each request reports in `usage.prompt_tokens_details.cached_tokens`, so the
harness's reconciliation can compare the two.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvbench.engines.kvengine.core.events import CacheEvent


class EngineMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name
        r = self.registry
        self.requests = Counter("kvbench:requests", "Finished requests by reason", labels + ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("kvbench:prompt_tokens", "Prompt tokens of finished requests", labels, registry=r)
        self.cached_tokens = Counter(
            "kvbench:prompt_tokens_cached", "Prompt tokens served from the prefix cache", labels, registry=r
        )
        self.generation_tokens = Counter("kvbench:generation_tokens", "Generated tokens", labels, registry=r)
        self.cache_events = Counter(
            "kvbench:kv_cache_events", "Prefix cache events in pages (stored, hit, evicted, moved)",
            labels + ["event", "tier"], registry=r,
        )
        self.pages_used = Gauge("kvbench:kv_pages_used", "Device KV pages in use (held or cached)", labels, registry=r)
        self.pages_total = Gauge("kvbench:kv_pages_capacity", "Usable device KV pages", labels, registry=r)
        self.bytes_per_token = Gauge("kvbench:kv_bytes_per_token", "KV bytes per cached token", labels, registry=r)
        self.running = Gauge("kvbench:num_requests_running", "Requests being computed", labels, registry=r)
        self.waiting = Gauge("kvbench:num_requests_waiting", "Requests waiting for admission", labels, registry=r)

    def finished(self, reason: str, prompt_tokens: int, cached_tokens: int) -> None:
        name = self.model_name
        self.requests.labels(name, reason).inc()
        self.prompt_tokens.labels(name).inc(prompt_tokens)
        self.cached_tokens.labels(name).inc(cached_tokens)

    def generated(self, count: int) -> None:
        self.generation_tokens.labels(self.model_name).inc(count)

    def events(self, events: list[CacheEvent]) -> None:
        for event in events:
            self.cache_events.labels(self.model_name, event.kind.value, event.tier).inc(event.num_pages)

    def occupancy(self, used: int, total: int, running: int, waiting: int, bytes_per_token: int) -> None:
        name = self.model_name
        self.pages_used.labels(name).set(used)
        self.pages_total.labels(name).set(total)
        self.running.labels(name).set(running)
        self.waiting.labels(name).set(waiting)
        self.bytes_per_token.labels(name).set(bytes_per_token)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
