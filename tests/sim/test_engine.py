"""The discrete-event simulator on tiny workloads: sane records, determinism, tiers under pressure."""

import dataclasses

import pytest

from kvbench.measure.metrics import summarize_run
from kvbench.measure.schedule import LoadSpec
from kvbench.sim.engine import SimConfig, simulate
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware
from kvbench.sim.presets import get_preset
from kvbench.sim.run_folder import sim_entry, write_sim_run
from kvbench.workloads.profiles import load_workload


def config(preset: str, device_kv_tokens: int | None = None, kv_dtype: str = "fp8") -> SimConfig:
    return SimConfig(
        load_geometry("qwen2.5-72b"), load_hardware("8xh200"), get_preset(preset), kv_dtype, "fp8", device_kv_tokens
    )


@pytest.fixture(scope="module")
def mini():
    return load_workload("rag-chat-mini", num_sessions=12, seed=3)


def test_records_are_sane_and_later_turns_reuse_their_prefix(mini):
    result = simulate(mini, LoadSpec(), config("vllm-prefix"))
    records = result.records
    assert len(records) == mini.num_requests and all(r.ok for r in records)
    for r in records:
        assert r.sent_ns == r.queued_ns < r.first_token_ns <= r.done_ns
        assert r.output_tokens == len(r.chunks) and r.prompt_tokens == r.prompt_len_sent
        assert [t for t, _ in r.chunks] == sorted(t for t, _ in r.chunks)
    later = [r for r in records if r.turn > 0]
    assert later and all(r.cached_tokens > 0 for r in later)
    # With room for everything, every reusable page-aligned token is cached: recompute is under one page.
    assert all(r.reusable_tokens - r.cached_tokens < 16 for r in later)
    summary = summarize_run(records).overall
    assert summary.ttft_ms.p50 > 0 and summary.output_tok_s > 0


def test_same_seed_same_records(mini):
    a = simulate(mini, LoadSpec(rate=2.0), config("lmcache-local", 1500), seed=7).records
    b = simulate(mini, LoadSpec(rate=2.0), config("lmcache-local", 1500), seed=7).records
    assert [r.to_json().replace('"run_id":"sim"', "") for r in a] == [
        r.to_json().replace('"run_id":"sim"', "") for r in b
    ]
    c = simulate(mini, LoadSpec(rate=2.0), config("lmcache-local", 1500), seed=8).records
    assert [r.queued_ns for r in a] != [r.queued_ns for r in c]


def test_device_only_recomputes_more_than_a_host_tier_when_the_working_set_overflows(mini):
    small = 2000  # tokens of device KV: a few sessions' worth, far below the workload's working set
    device_only = summarize_run(simulate(mini, LoadSpec(), config("vllm-prefix", small)).records).overall.cache
    with_host = summarize_run(simulate(mini, LoadSpec(), config("lmcache-local", small)).records).overall.cache
    assert device_only.prefill_recompute_rate > 0.2
    assert with_host.prefill_recompute_rate < device_only.prefill_recompute_rate / 2
    big = summarize_run(simulate(mini, LoadSpec(), config("vllm-prefix")).records).overall.cache
    assert big.prefill_recompute_rate < device_only.prefill_recompute_rate


def test_fp8_kv_doubles_device_pages():
    assert config("vllm-prefix", kv_dtype="fp8").device_pages() == pytest.approx(
        2 * config("vllm-prefix", kv_dtype="fp16").device_pages(), abs=1
    )


def test_shared_remote_tier_serves_turns_that_move_between_nodes(mini):
    result = simulate(mini, LoadSpec(concurrency=6), config("lmcache-shared", 1500))
    assert {n["node"] for n in result.nodes} == {0, 1}
    assert all(n["steps"] > 0 for n in result.nodes)
    assert sum(n["restored_tokens"].get("remote", 0) for n in result.nodes) > 0
    assert sum(r.cached_tokens_by_tier.get("remote", 0) for r in result.records) > 0


def test_a_prompt_that_never_fits_is_an_error_not_a_hang(mini):
    result = simulate(mini, LoadSpec(), config("vllm-prefix", 64))
    assert any(r.error for r in result.records)


def test_run_folder_has_the_harness_files(mini, tmp_path):
    cfg = config("sglang-radix")
    result = simulate(mini, LoadSpec(), cfg)
    entry = sim_entry(result, mini, LoadSpec(), cfg)
    write_sim_run(tmp_path, [(result, entry)], {"simulate": {}}, plots=False)
    for name in ("requests.jsonl", "summary.json", "summary.csv", "summary.md", "config.yaml"):
        assert (tmp_path / name).is_file()
    md = (tmp_path / "summary.md").read_text()
    assert "sim:sglang-radix" in md and "fp8" in md
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == len(result.records)


def test_the_tenant_ledger_decides_who_keeps_pages_under_pressure():
    """The core's tenant ledger runs in the simulator: a premium reservation protects tenant-b's pages, a
    small quota makes tenant-a's pages go first."""
    from kvbench.engines.kvengine.settings.tenants import (
        TenantsConfig,
        parse_tenants,
    )

    workload = load_workload("rag-chat-mt-mini", seed=3)

    def hit_rates(tenants) -> dict[str, float]:
        sim = dataclasses.replace(config("vllm-prefix", 4000), tenants=tenants)
        summary = summarize_run(simulate(workload, LoadSpec(rate=2.0), sim).records)
        return {s.tenant: s.cache.cache_hit_rate for s in summary.per_tenant}

    plain = hit_rates(TenantsConfig())
    reserved = hit_rates(parse_tenants({"tenants": {"tenant-b": {"api_keys": ["kb"], "reserved_device_pages": 100}}}))
    quota = hit_rates(parse_tenants({"tenants": {"tenant-a": {"api_keys": ["ka"], "quota_pages": 40}}}))
    assert reserved["tenant-b"] > plain["tenant-b"] + 0.05
    assert quota["tenant-a"] < plain["tenant-a"] - 0.05
    assert quota["tenant-c"] > plain["tenant-c"]
