"""The simulator and our real engine make the same cache decisions on the same workload.

Our engine (tiny random weights, behind its HTTP server) serves a multi-turn RAG workload through the real
load generator at concurrency 1, with a device KV cache small enough that pages are evicted. The simulator
then replays the same workload in the order the real run sent it (`send_order`) with the same cache size,
page size and step budget. Both run the same core, so the stream of cache events (pages stored, hit,
evicted, in order) and every request's cached-token count must be identical; only the times differ.
"""

import dataclasses

import pytest

from kvbench.engines.kvengine.core.events import EventKind, EventLog
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.harness import eventloop
from kvbench.harness.client import EndpointConfig
from kvbench.harness.loadgen import LoadGenerator
from kvbench.measure.records import RecordWriter
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.sim.validate import send_order
from kvbench.workloads.profiles import load_workload

from ..engines.kvengine.server.server_fixture import serving

KV_TOKENS = 1280  # a bit over one session's context (the longest request needs 65 pages): pages get evicted
STEP_TOKENS = 512
MAX_SEQS = 16


def decisions(events) -> list[tuple[str, int]]:
    """The order-sensitive content of a cache event stream: what happened to how many pages."""
    return [(event.kind.value, event.num_pages) for event in events]


def serve_workload(tmp_dir, **engine_settings):
    """Our engine (tiny random weights, small device cache, `engine_settings` on top) behind its HTTP server,
    serving a 5-session RAG workload through the real load generator at concurrency 1. Returns the workload,
    the load, the records and every cache event the engine emitted, in order."""
    workload = load_workload("rag-chat-mini", num_sessions=5, seed=11, vocab_size=512)
    engine = Engine(
        EngineConfig(
            model="tiny-random",
            kv_capacity=KV_TOKENS,
            max_num_seqs=MAX_SEQS,
            max_step_tokens=STEP_TOKENS,
            **engine_settings,
        )
    )
    stream = []
    engine.event_listeners.append(stream.extend)
    load = LoadSpec(concurrency=1)
    try:
        with serving(engine) as url, RecordWriter(tmp_dir / "requests.jsonl") as writer:
            generator = LoadGenerator(
                endpoint=EndpointConfig(base_url=url, model="tiny-random"), load=load, run_id="real"
            )
            result = eventloop.run(generator.run(workload, writer))
    finally:
        engine.close()
    return workload, load, result.records, stream


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    return serve_workload(tmp_path_factory.mktemp("real"))


@pytest.mark.slow
def test_simulator_replays_the_engine_cache_decisions_exactly(real_run):
    workload, load, records, real_events = real_run
    assert len(records) == workload.num_requests and all(r.ok for r in records)
    preset = dataclasses.replace(get_preset("vllm-prefix"), max_step_tokens=STEP_TOKENS, max_num_seqs=MAX_SEQS)
    config = SimConfig(load_geometry("smollm2-135m"), load_hardware("cpu"), preset, "fp32", device_kv_tokens=KV_TOKENS)
    sim_events = EventLog()
    result = simulate(workload, load, config, send_order=send_order(records), events=sim_events)

    kinds = {kind for kind, _ in decisions(real_events)}
    assert {EventKind.STORED.value, EventKind.HIT.value, EventKind.EVICTED.value} <= kinds  # the cache was tested
    assert decisions(sim_events.take_events()) == decisions(real_events)
    real = {r.request_id: r.cached_tokens for r in records}
    simulated = {r.request_id: r.cached_tokens for r in result.records}
    assert simulated == real
    assert sum(real.values()) > 0


def test_without_the_send_order_the_comparison_would_not_be_exact_by_construction(real_run):
    """The replay order is what the check rests on: a simulation that is told a different order than the
    real run's makes different decisions, so the equality above is not vacuous."""
    workload, load, records, real_events = real_run
    preset = dataclasses.replace(get_preset("vllm-prefix"), max_step_tokens=STEP_TOKENS, max_num_seqs=MAX_SEQS)
    config = SimConfig(load_geometry("smollm2-135m"), load_hardware("cpu"), preset, "fp32", device_kv_tokens=KV_TOKENS)
    order = send_order(records)
    by_session: dict[str, list[str]] = {}
    for rid in order:
        by_session.setdefault(rid.split("/")[0], []).append(rid)
    sessionwise = [rid for session in sorted(by_session) for rid in by_session[session]]  # one session at a time
    assert sessionwise != order
    sim_events = EventLog()
    simulate(workload, load, config, send_order=sessionwise, events=sim_events)
    assert decisions(sim_events.take_events()) != decisions(real_events)


def test_the_shipped_tiny_random_geometry_is_the_engine_test_model():
    from kvbench.engines.kvengine.model.tiny import TINY_CONFIG as c

    g = load_geometry("tiny-random")
    assert (
        g.hidden_size,
        g.intermediate_size,
        g.num_layers,
        g.num_heads,
        g.num_kv_heads,
        g.head_dim,
        g.vocab_size,
        g.tie_word_embeddings,
    ) == (
        c.hidden_size,
        c.intermediate_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size,
        c.tie_word_embeddings,
    )


HOST_TOKENS = 4096


@pytest.fixture(scope="module")
def tiered_run(tmp_path_factory):
    """A host tier under the same small device cache: evicted pages go to host (TTL policy) and come back
    when a later turn needs them."""
    return serve_workload(tmp_path_factory.mktemp("tiered"), host_capacity=HOST_TOKENS)


def by_tier(record) -> dict[str, int]:
    return {tier: n for tier, n in (record.cached_tokens_by_tier or {}).items() if n}


@pytest.mark.slow
def test_the_engine_ttl_tiers_preset_restores_what_the_engine_restores(tiered_run):
    """The kvengine-tiers preset runs the core's TierPolicy as the engine's offload executor does: the same
    pages go down to host, the same ones come back, and every request reports the same cached tokens per
    tier. (MOVED events are compared as totals: the engine copies evicted pages down at more points of its
    step than the simulator, so their place in the stream differs while the decisions do not.)"""
    workload, load, records, real_events = tiered_run
    assert len(records) == workload.num_requests and all(r.ok for r in records)
    preset = dataclasses.replace(get_preset("kvengine-tiers"), max_step_tokens=STEP_TOKENS, max_num_seqs=MAX_SEQS)
    config = SimConfig(
        load_geometry("tiny-random"),
        load_hardware("cpu"),
        preset,
        "fp32",
        device_kv_tokens=KV_TOKENS,
        host_kv_tokens=HOST_TOKENS,
        disk_kv_tokens=0,
    )
    sim_log = EventLog()
    result = simulate(workload, load, config, send_order=send_order(records), events=sim_log)
    sim_events = sim_log.take_events()

    def device_decisions(events):
        return [(e.kind.value, e.num_pages) for e in events if e.kind != EventKind.MOVED and e.tier == "device"]

    def moved(events):
        return sum(e.num_pages for e in events if e.kind == EventKind.MOVED)

    assert moved(real_events) > 0  # pages did go down to host
    assert device_decisions(sim_events) == device_decisions(real_events)
    assert moved(sim_events) == moved(real_events)
    real = {r.request_id: by_tier(r) for r in records}
    assert any("host" in tiers for tiers in real.values())  # and came back from it
    assert {r.request_id: by_tier(r) for r in result.records} == real
