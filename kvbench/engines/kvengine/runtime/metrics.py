"""The engine's Prometheus metrics, in a registry of its own (no global state), named `kvbench:*`.

Counters are cumulative since start, as vLLM's and SGLang's are; kvbench reads run deltas. The cached-token
counter counts exactly what each request reports in `usage.prompt_tokens_details.cached_tokens`, so the
harness's reconciliation can compare the two.

Per tenant (label `tenant`; tier one of device, host, disk, remote):
- `kvbench:tenant_prompt_tokens_total`, `kvbench:tenant_cached_tokens_total{tier}`: hit rate by tier is
  rate(cached{tier}) / rate(prompt); the cached tokens summed over tiers equal the usage's cached_tokens.
- `kvbench:tenant_kv_evictions_total{tier}`: pages that left a tier (to a slower tier, or dropped);
  `kvbench:tenant_kv_moves_total{tier}`: pages that entered a tier from another one.
- `kvbench:tenant_kv_pages{tier}`: pages held now (device, host, disk; the shared remote tier is not per
  engine and is not counted); `kvbench:tenant_kv_quota_pages` and `kvbench:tenant_kv_quota_usage_ratio`
  (device pages / quota) for tenants with a quota.
Device KV: `kvbench:kv_capacity_tokens` and `kvbench:kv_capacity_bytes`, the tier as allocated (after
`kv_capacity: auto` or `kv_capacity_bytes` were resolved), per device; `kvbench:kv_pages_used` of
`kvbench:kv_pages_capacity` pages in use.
Parking: `kvbench:num_requests_parked` requests set aside now (their streaming client reads nothing: no batch
slot, no device page held; see `core/parking.py`), `kvbench:requests_parked_total` times one was.
Per tier: `kvbench:kv_tier_failures_total{tier,reason}`: a tier skipped (full, unavailable) or a page
that failed verification (corrupt: cut short or another layout; forged: its HMAC fails), each a miss and a
recompute, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvbench.engines.kvengine.core.events import CacheEvent, EventKind

TIER_LABELS = ("device", "host", "disk", "remote")


class EngineMetrics:
    def __init__(self, model_name: str, quotas: Mapping[str, int] | None = None) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name
        self.quotas = dict(quotas or {})
        r = self.registry
        self.requests = Counter(
            "kvbench:requests", "Finished requests by reason", labels + ["finish_reason"], registry=r
        )
        self.prompt_tokens = Counter("kvbench:prompt_tokens", "Prompt tokens of finished requests", labels, registry=r)
        self.cached_tokens = Counter(
            "kvbench:prompt_tokens_cached", "Prompt tokens served from the prefix cache", labels, registry=r
        )
        self.generation_tokens = Counter("kvbench:generation_tokens", "Generated tokens", labels, registry=r)
        self.cache_events = Counter(
            "kvbench:kv_cache_events",
            "Prefix cache events in pages (stored, hit, evicted, moved)",
            labels + ["event", "tier"],
            registry=r,
        )
        self.pages_used = Gauge("kvbench:kv_pages_used", "Device KV pages in use (held or cached)", labels, registry=r)
        self.pages_total = Gauge("kvbench:kv_pages_capacity", "Usable device KV pages", labels, registry=r)
        self.bytes_per_token = Gauge("kvbench:kv_bytes_per_token", "KV bytes per cached token", labels, registry=r)
        self.capacity_tokens = Gauge(
            "kvbench:kv_capacity_tokens", "Device KV tier size in tokens, per device", labels, registry=r
        )
        self.capacity_bytes = Gauge(
            "kvbench:kv_capacity_bytes", "Device KV tier size in bytes, per device", labels, registry=r
        )
        self.prefill_budget = Gauge(
            "kvbench:prefill_beside_decodes_tokens",
            "Prefill tokens a step computes beside running decodes (max_prefill_beside_decodes, resolved)",
            labels,
            registry=r,
        )
        self.running = Gauge("kvbench:num_requests_running", "Requests being computed", labels, registry=r)
        self.waiting = Gauge("kvbench:num_requests_waiting", "Requests waiting for admission", labels, registry=r)
        self.parked = Gauge(
            "kvbench:num_requests_parked", "Requests set aside while their client reads nothing", labels, registry=r
        )
        self.parked_total = Counter(
            "kvbench:requests_parked",
            "Times a request was set aside for a client that read nothing",
            labels,
            registry=r,
        )
        tenant = labels + ["tenant"]
        self.tenant_prompt = Counter(
            "kvbench:tenant_prompt_tokens", "Prompt tokens of finished requests, per tenant", tenant, registry=r
        )
        self.tenant_cached = Counter(
            "kvbench:tenant_cached_tokens",
            "Cached prompt tokens per tenant by source tier",
            tenant + ["tier"],
            registry=r,
        )
        self.tenant_evictions = Counter(
            "kvbench:tenant_kv_evictions", "Pages that left a tier, per tenant", tenant + ["tier"], registry=r
        )
        self.tenant_moves = Counter(
            "kvbench:tenant_kv_moves",
            "Pages that entered a tier from another, per tenant",
            tenant + ["tier"],
            registry=r,
        )
        self.tenant_pages = Gauge(
            "kvbench:tenant_kv_pages", "Pages held per tenant and tier", tenant + ["tier"], registry=r
        )
        self.quota_pages = Gauge("kvbench:tenant_kv_quota_pages", "Device page quota per tenant", tenant, registry=r)
        self.quota_usage = Gauge(
            "kvbench:tenant_kv_quota_usage_ratio", "Device pages held / quota, per tenant", tenant, registry=r
        )
        self.tier_failures_total = Counter(
            "kvbench:kv_tier_failures",
            "Tier operations skipped or pages rejected",
            labels + ["tier", "reason"],
            registry=r,
        )
        for name, quota in self.quotas.items():
            self.quota_pages.labels(model_name, name).set(quota)
            self.quota_usage.labels(model_name, name).set(0)

    def finished(
        self,
        reason: str,
        prompt_tokens: int,
        cached_tokens: int,
        tenant: str = "default",
        cached_by_tier: Mapping[str, int] | None = None,
    ) -> None:
        name = self.model_name
        self.requests.labels(name, reason).inc()
        self.prompt_tokens.labels(name).inc(prompt_tokens)
        self.cached_tokens.labels(name).inc(cached_tokens)
        self.tenant_prompt.labels(name, tenant).inc(prompt_tokens)
        for tier, count in (cached_by_tier or {}).items():
            self.tenant_cached.labels(name, tenant, tier).inc(count)

    def generated(self, count: int) -> None:
        self.generation_tokens.labels(self.model_name).inc(count)

    def events(self, events: list[CacheEvent]) -> None:
        name = self.model_name
        for event in events:
            self.cache_events.labels(name, event.kind.value, event.tier).inc(event.num_pages)
            if event.kind == EventKind.EVICTED:
                self.tenant_evictions.labels(name, event.tenant, event.tier).inc(event.num_pages)
            elif event.kind == EventKind.MOVED:
                self.tenant_moves.labels(name, event.tenant, event.tier).inc(event.num_pages)

    def tier_failures(self, failures) -> None:
        for failure in failures:
            self.tier_failures_total.labels(self.model_name, failure.tier, failure.reason).inc()

    def set_tenant_pages(self, pages: Mapping[tuple[str, str], int]) -> None:
        """Set the pages-per-tier gauges; a (tenant, tier) seen before and absent now is set to 0."""
        name = self.model_name
        for sample in self.tenant_pages.collect()[0].samples:
            key = (sample.labels["tenant"], sample.labels["tier"])
            if key not in pages:
                self.tenant_pages.labels(name, *key).set(0)
        for (tenant, tier), count in pages.items():
            self.tenant_pages.labels(name, tenant, tier).set(count)
        for tenant, quota in self.quotas.items():
            if quota:
                self.quota_usage.labels(name, tenant).set(pages.get((tenant, "device"), 0) / quota)

    def capacity(self, tokens: int, bytes_per_token: int) -> None:
        """The device KV tier as allocated (set once: what a run's summary records as the engine's capacity)."""
        self.capacity_tokens.labels(self.model_name).set(tokens)
        self.capacity_bytes.labels(self.model_name).set(tokens * bytes_per_token)

    def prefill_beside_decodes(self, tokens: int | None) -> None:
        """The scheduler's prefill budget beside decodes (None: the step budget alone; the gauge is left out)."""
        if tokens is not None:
            self.prefill_budget.labels(self.model_name).set(tokens)

    def occupancy(
        self, used: int, total: int, running: int, waiting: int, bytes_per_token: int, parked: int = 0
    ) -> None:
        name = self.model_name
        self.parked.labels(name).set(parked)
        self.pages_used.labels(name).set(used)
        self.pages_total.labels(name).set(total)
        self.running.labels(name).set(running)
        self.waiting.labels(name).set(waiting)
        self.bytes_per_token.labels(name).set(bytes_per_token)

    def parked_request(self) -> None:
        self.parked_total.labels(self.model_name).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
