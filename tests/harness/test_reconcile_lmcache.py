"""reconcile_lmcache on real /metrics dumps of vLLM + LMCache (connector mp) on this CPU, captured by
tests/data/lmcache/capture.py: `first` stored a 1,100-token prompt's 4 chunks and, after vLLM's own cache was
dropped, loaded them back from LMCache's DRAM (L1); `second`, a restarted vLLM and LMCache server on the same
Redis, loaded them from Redis (L2). The requests' own cached_tokens are the ones those runs reported."""

from __future__ import annotations

import dataclasses
import json

from kvbench.engines.prometheus import parse_samples
from kvbench.harness.reconcile import reconcile, reconcile_lmcache
from kvbench.measure.metrics import SLO
from kvbench.measure.records import PointId, RequestRecord
from kvbench.measure.report import write_summaries
from kvbench.measure.run_folder import SUMMARY_MD, RunEntry

from ..paths import REPO

DATA = REPO / "tests" / "data" / "lmcache"
CHUNKS = 1024  # what a hit on the 1,100-token prompt covers: 4 whole chunks of 256


def _dump(name: str) -> tuple[list[RequestRecord], dict[str, float], dict[str, float]]:
    """The run's requests (with the cached_tokens they reported) and the two scrapes, vLLM's and the cache
    server's samples together (as LMCacheAdapter.scrape_metrics merges them)."""
    captured = json.loads((DATA / f"{name}.json").read_text())
    scrapes = [
        {**parse_samples(captured[when]["vllm"]), **parse_samples(captured[when]["lmcache_server"])}
        for when in ("before", "after")
    ]
    records = [
        RequestRecord("p", f"r{index}", "s", "t", 0, 0, prompt_tokens=captured["prompt_tokens"], cached_tokens=cached)
        for index, cached in enumerate(captured["cached_tokens"])
    ]
    return records, scrapes[0], scrapes[1]


def test_the_first_instance_loads_from_lmcaches_dram_and_the_counters_reconcile():
    records, before, after = _dump("first")
    assert [record.cached_tokens for record in records] == [0, CHUNKS]
    found = reconcile_lmcache(records, before, after)
    assert found["problems"] == []
    assert found["vllm_external_tokens"] == CHUNKS and found["hit_l1_tokens"] >= CHUNKS
    assert found["stored_chunks"] >= 4 and found["retrieved_chunks"] >= 4
    assert found["client_cached_tokens"] == CHUNKS
    whole = reconcile(records, before, after)
    assert whole.agree is True and whole.lmcache == found and "LMCache: hit" in whole.detail


def test_a_restarted_instance_loads_from_redis_and_the_counters_reconcile():
    records, before, after = _dump("second")
    found = reconcile_lmcache(records, before, after)
    assert [record.cached_tokens for record in records] == [CHUNKS]
    assert found["problems"] == [] and found["hit_l2_tokens"] >= CHUNKS and found["vllm_external_tokens"] == CHUNKS
    assert reconcile(records, before, after).agree is True


def test_requests_reporting_fewer_cached_tokens_than_lmcache_delivered_are_flagged_in_summary_md(tmp_path):
    records, before, after = _dump("first")
    short = [records[0], dataclasses.replace(records[1], cached_tokens=0)]
    found = reconcile(short, before, after)
    # vLLM's cached-token counter disagrees too; the LMCache check names the tokens the connector delivered.
    assert found.agree is False
    assert f"the requests reported 0 cached tokens, fewer than the {CHUNKS} vLLM loaded" in found.lmcache["problems"]
    entry = RunEntry.of(PointId("p", "lmcache", "c=1", 0), short, SLO(), reconciliation=found.to_dict())
    write_summaries(tmp_path, [entry])
    assert f"fewer than the {CHUNKS} vLLM loaded" in (tmp_path / SUMMARY_MD).read_text()


def test_lmcaches_counters_that_do_not_hold_together_are_named():
    records, before, after = _dump("first")
    broken = {key: value for key, value in after.items() if not key.startswith("lmcache_mp_lookup_hit_l1_tokens")}
    broken["lmcache_mp_lookup_hit_l1_tokens_total"] = 1.0
    problems = reconcile_lmcache(records, before, broken)["problems"]
    assert any("by tier" in problem for problem in problems), problems


def test_a_run_without_lmcache_counters_has_no_lmcache_check():
    records, before, after = _dump("first")
    vllm_only = {key: value for key, value in after.items() if not key.startswith("lmcache_mp_")}
    assert reconcile_lmcache(records, before, vllm_only) is None
    assert reconcile(records, before, vllm_only).lmcache is None
    assert reconcile_lmcache(records, None, after) is None
