"""Validation of the simulator against a real run of our engine: replay the run, compare what both measured.

A real run's records fix what the simulator must reproduce: which requests were sent, in which order
(`send_order`). Replayed in that order with the same cache size, page size and step budget, the simulator
runs the same core on the same prompts, so its cache decisions match the engine's: exactly at concurrency 1
(tests/sim/test_matches_engine.py); with more in flight, or in open loop, the batches the two form and the
order of finishes and arrivals follow each one's timing and can differ. Its timings come from the cost model,
whose hardware profile `kvbench calibrate` fits to the engine's measured steps.

`sim_config_for_engine` and `simulate_run` rebuild one run of our engine as a simulation; `compare_records`
puts the two side by side: cache hit rate (must be equal), TTFT p50/p99 (within a tolerance), and the rest for
reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig, IsolationMode
from kvbench.engines.kvengine.settings.tenants import TenantsConfig, load_tenants
from kvbench.measure.metrics import Summary, summarize
from kvbench.measure.records import RequestRecord
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, SimResult, simulate
from kvbench.sim.geometry import ModelGeometry, load_geometry
from kvbench.sim.hardware import Hardware
from kvbench.sim.presets import get_preset
from kvbench.workloads.spec import Workload

DEFAULT_MODEL_GEOMETRY = "smollm2-135m"  # what our engine's "default" model is
WEIGHT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def send_order(records: Iterable[RequestRecord]) -> list[str]:
    """Request ids in the order the load generator sent them (requests never sent are left out)."""
    sent = [r for r in records if r.sent_ns is not None]
    return [r.request_id for r in sorted(sent, key=lambda r: (r.sent_ns, r.request_id))]


def engine_geometry(model: str, override: str | None = None) -> ModelGeometry:
    """The geometry of the model our engine served: `override`, else the default model's, else the model's
    own folder (a path with config.json) or a shipped name such as `tiny-random`."""
    if override:
        return load_geometry(override)
    return load_geometry(DEFAULT_MODEL_GEOMETRY if model == "default" else model)


def sim_config_for_engine(settings: EngineConfig, geometry: ModelGeometry, hardware: Hardware) -> SimConfig:
    """A SimConfig with our engine's cache, tier and batching settings (the same `EngineConfig` fields the
    engine reads): the kvengine-tiers preset (the core's TierPolicy) with the run's host/disk capacities and
    TTLs. The shared Redis tier is not simulated."""
    if not settings.prefix_caching:
        raise ValueError("engine settings: prefix_caching is off; the simulator always caches prefixes")
    if settings.remote_url:
        raise ValueError(
            "engine settings: the run used the shared Redis tier (remote_url), which the simulator "
            "does not model for our engine; validate a run without it"
        )
    if settings.max_prefill_beside_decodes == AUTO:
        raise ValueError(
            "engine settings: max_prefill_beside_decodes is auto, which the engine timed at start; "
            "validate with max_prefill_beside_decodes set to the tokens its log names ('prefill "
            "budget') or /metrics states (kvbench:prefill_beside_decodes_tokens)"
        )
    preset = dataclasses.replace(
        get_preset("kvengine-tiers"),
        name="kvengine",
        page_size=settings.page_size,
        max_num_seqs=settings.max_num_seqs,
        max_step_tokens=settings.max_step_tokens,
        max_prefill_beside_decodes=settings.max_prefill_beside_decodes,
        padded_attention=False,
        device_ttl_s=settings.device_ttl_s,
        host_ttl_s=settings.host_ttl_s,
        tier_interval_s=settings.tier_interval_s,
    )
    kv_tokens = settings.kv_capacity
    if kv_tokens == AUTO and settings.kv_capacity_bytes is None:
        raise ValueError(
            "engine settings: kv_capacity is auto, which the engine sized from its free memory; "
            "validate with kv_capacity set to the tokens its log names ('memory budget per device')"
        )
    if settings.kv_capacity_bytes is not None:
        kv_tokens = int(settings.kv_capacity_bytes // geometry.kv_bytes_per_token(settings.kv_dtype.value))
    tenants = load_tenants(settings.tenants_file) if settings.tenants_file else TenantsConfig()
    return SimConfig(
        geometry,
        hardware,
        preset,
        settings.kv_dtype.value,
        WEIGHT_DTYPES.get(settings.compute_dtype, "fp32"),
        device_kv_tokens=kv_tokens,
        strict_isolation=settings.isolation == IsolationMode.STRICT,
        tenants=tenants,
        host_kv_tokens=settings.host_capacity,
        disk_kv_tokens=settings.disk_capacity,
    )


def simulate_run(
    workload: Workload, load: LoadSpec, config: SimConfig, records: Sequence[RequestRecord], seed: int
) -> SimResult:
    """The simulation of a real run: same workload and load, replayed in the run's send order."""
    return simulate(workload, load, config, run_id="sim", seed=seed, send_order=send_order(records))


@dataclass(frozen=True, slots=True)
class MetricRow:
    name: str
    real: float | None
    sim: float | None
    tolerance: float | None  # relative; 0.0: must be equal; None: shown for reference only

    @property
    def ratio(self) -> float | None:
        if self.real is None or self.sim is None or self.real == 0:
            return None
        return self.sim / self.real

    @property
    def ok(self) -> bool | None:
        """Within tolerance (None: not judged, or a side is missing)."""
        if self.tolerance is None or self.real is None or self.sim is None:
            return None
        if self.tolerance == 0.0:
            return abs(self.sim - self.real) < 1e-9
        return abs(self.sim - self.real) <= self.tolerance * abs(self.real)


@dataclass(frozen=True, slots=True)
class Validation:
    rows: tuple[MetricRow, ...]
    same_cached: int  # requests whose cached-token counts agree
    compared: int  # requests completed on both sides

    @property
    def ok(self) -> bool:
        return all(row.ok is not False for row in self.rows)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "same_cached_tokens": self.same_cached,
            "compared_requests": self.compared,
            "metrics": [
                {"name": r.name, "real": r.real, "sim": r.sim, "ratio": r.ratio, "tolerance": r.tolerance, "ok": r.ok}
                for r in self.rows
            ],
        }


def compare_records(
    real: Sequence[RequestRecord], sim: Sequence[RequestRecord], ttft_tolerance: float = 0.25
) -> Validation:
    """Real and simulated records of one run side by side (warm-up requests excluded, as in summaries)."""
    real_summary, sim_summary = summarize(real), summarize(sim)

    def row(name: str, pick, tolerance: float | None) -> MetricRow:
        return MetricRow(name, pick(real_summary), pick(sim_summary), tolerance)

    rows = (
        row("requests completed", lambda s: float(s.completed), 0.0),
        row("cache hit rate", lambda s: s.cache.cache_hit_rate, 0.0),
        row("prefill recompute rate", lambda s: s.cache.prefill_recompute_rate, None),
        row("TTFT p50 ms", lambda s: _dist(s, "ttft_ms", "p50"), ttft_tolerance),
        row("TTFT p99 ms", lambda s: _dist(s, "ttft_ms", "p99"), ttft_tolerance),
        row("TTFT mean ms", lambda s: _dist(s, "ttft_ms", "mean"), None),
        row("TPOT p50 ms", lambda s: _dist(s, "tpot_ms", "p50"), None),
        row("output tok/s", lambda s: s.output_tok_s, None),
        row("duration s", lambda s: s.duration_s, None),
    )
    real_cached = {r.request_id: r.cached_tokens for r in real if r.ok and not r.warmup}
    sim_cached = {r.request_id: r.cached_tokens for r in sim if r.ok and not r.warmup}
    both = real_cached.keys() & sim_cached.keys()
    same = sum(1 for rid in both if real_cached[rid] == sim_cached[rid])
    return Validation(rows, same, len(both))


def _dist(summary: Summary, field: str, stat: str) -> float | None:
    value = getattr(summary, field)
    return None if value is None else getattr(value, stat)


def workload_name_matches(spec_name: str, workload_name: str) -> bool:
    return spec_name == workload_name or Path(spec_name).stem == workload_name
