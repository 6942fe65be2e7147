"""Host and disk KV tiers with an accelerated clock: demotion by TTL, resume by tier, bad pages, full disks."""

from __future__ import annotations

import errno
import stat
import threading

import pytest
import torch

from kvbench.engines.kvengine.core.tiers import Tier
from kvbench.engines.kvengine.runtime.tier_stores import DiskStore, HostStore
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model

from .tiers_fixtures import FakeClock, greedy, make_engine, run, tokens

PROMPT = list(range(300, 380))  # 5 full pages
NEXT = PROMPT + list(range(100, 132))  # the session's next turn: 7 pages


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded_model(seed=3)


@pytest.fixture
def tiered(loaded, tmp_path):
    clock = FakeClock()
    engine = make_engine(loaded, clock, host_capacity=1024, disk_capacity=4096, disk_dir=str(tmp_path / "disk"))
    yield engine, clock
    engine.close()


def tier_usage(engine) -> dict[str, int]:
    usage = engine.offload.policy.usage()
    return {tier.name.lower(): n for tier, n in usage.items() if n}


def test_idle_session_moves_to_host_then_disk_and_resumes_with_identical_output(loaded, tiered):
    engine, clock = tiered
    reference = tokens(run(make_engine(loaded), greedy("ref", NEXT))["ref"])
    run(engine, greedy("t1", PROMPT))
    cached_pages = engine.index.cached_pages
    assert cached_pages == 5  # 80 prompt + 7 generated tokens: 5 full pages cached

    clock.advance(29)
    engine.step()
    assert engine.index.cached_pages == cached_pages and not tier_usage(engine)  # still hot

    clock.advance(2)  # 31 s idle: past the device TTL
    engine.step()
    assert engine.index.cached_pages == 0
    assert tier_usage(engine) == {"host": cached_pages}

    clock.advance(600)  # past the host TTL
    engine.step()
    assert tier_usage(engine) == {"disk": cached_pages}
    assert len(engine.offload.host) == 0

    out = run(engine, greedy("t2", NEXT))["t2"]
    assert tokens(out) == reference
    assert out[-1].cached_tokens == 80
    assert out[-1].cached_tokens_by_tier == {"disk": 80}
    assert not tier_usage(engine)  # moved up: the disk copies are gone, the pages are on device


def test_host_hits_and_device_hits_are_counted_per_tier(loaded, tiered):
    engine, clock = tiered
    run(engine, greedy("t1", PROMPT[:48]))  # 3 pages
    clock.advance(31)
    engine.step()  # the 3 pages (2 prompt + 1 with generated tokens) go to host
    run(engine, greedy("t2", PROMPT))  # recomputes the generated page; 2 pages from host
    clock.advance(31)
    engine.step()
    out = run(engine, greedy("t3", NEXT))["t3"]
    assert out[-1].cached_tokens_by_tier == {"host": 80}
    out = run(engine, greedy("t4", NEXT))["t4"]
    assert out[-1].cached_tokens_by_tier == {"device": 96}
    assert sum(out[-1].cached_tokens_by_tier.values()) == out[-1].cached_tokens


def demote_to_disk(engine, clock) -> None:
    run(engine, greedy("t1", PROMPT))
    clock.advance(31)
    engine.step()
    clock.advance(600)
    engine.step()
    assert tier_usage(engine) == {"disk": 5}


@pytest.mark.parametrize("damage, reason", [("flip", "forged"), ("truncate", "corrupt"), ("copied", "forged")])
def test_a_corrupted_truncated_or_foreign_disk_page_is_a_miss_and_the_output_is_unchanged(
    loaded, tiered, damage, reason
):
    engine, clock = tiered
    reference = tokens(run(make_engine(loaded), greedy("ref", NEXT))["ref"])
    demote_to_disk(engine, clock)
    from kvbench.engines.kvengine.core.content_keys import page_keys
    from kvbench.engines.kvengine.core.namespaces import namespace_for

    keys = page_keys(engine.key_salt, namespace_for("default", shareable=False, strict=True), NEXT, 16)
    path = engine.offload.disk.path(keys[2])  # the third page: pages 0-1 restore, the rest is recomputed
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # a whole, valid record of another page, under this page's name
        path.write_bytes(engine.offload.disk.path(keys[3]).read_bytes())
    out = run(engine, greedy("t2", NEXT))["t2"]
    assert tokens(out) == reference
    assert out[-1].cached_tokens_by_tier == {"disk": 32}
    failures = engine.metrics.tier_failures_total.labels(engine.model_name, "disk", reason)._value.get()
    assert failures == 1  # a payload whose MAC fails (flipped, or another page's) is counted as forged


def test_disk_pages_are_private_to_the_engines_user(loaded, tiered):
    engine, clock = tiered
    demote_to_disk(engine, clock)
    root = engine.offload.disk.root
    files = list(root.rglob("*.kvp"))
    assert len(files) == 5
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_full_disk_is_skipped_and_counted_and_the_engine_keeps_serving(loaded, tiered, monkeypatch):
    engine, clock = tiered
    reference = tokens(run(make_engine(loaded), greedy("ref", NEXT))["ref"])

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskStore, "_write_file", staticmethod(full))
    run(engine, greedy("t1", PROMPT))
    clock.advance(31)
    engine.step()
    clock.advance(600)
    engine.step()  # host -> disk fails: the pages are dropped, not kept on a full tier
    assert not tier_usage(engine)
    assert not list((engine.offload.disk.root).rglob("*.kvp")) and not list(engine.offload.disk.root.rglob("*.tmp"))
    assert engine.metrics.tier_failures_total.labels(engine.model_name, "disk", "full")._value.get() == 5
    out = run(engine, greedy("t2", NEXT))["t2"]
    assert tokens(out) == reference and out[-1].cached_tokens == 0


def test_host_capacity_pushes_the_least_recent_pages_to_disk(loaded, tmp_path):
    clock = FakeClock()
    engine = make_engine(loaded, clock, host_capacity=64, disk_capacity=4096, disk_dir=str(tmp_path / "d"))
    run(engine, greedy("t1", PROMPT))
    clock.advance(31)
    engine.step()  # 5 pages leave device for a 4-page host tier: the oldest moves on to disk
    clock.advance(0.5)
    engine.step()
    usage = engine.offload.policy.usage()
    assert usage[Tier.HOST] == 4 and usage[Tier.DISK] == 1
    engine.close()


def test_pages_evicted_by_the_schedule_are_written_down_off_the_step_thread(loaded, monkeypatch):
    """The step only gathers the evicted pages' bytes; the demotion worker writes them into the host tier
    while the model runs, and the step records them before it returns: the next request finds them."""
    writers: list[str] = []
    put_tensor = HostStore.put_tensor

    def spy(self, key, row):
        writers.append(threading.current_thread().name)
        return put_tensor(self, key, row)

    reference = tokens(run(make_engine(loaded), greedy("ref", PROMPT))["ref"])
    engine = make_engine(loaded, kv_capacity=96, host_capacity=1024)  # 6 device pages
    monkeypatch.setattr(HostStore, "put_tensor", spy)
    run(engine, greedy("a", PROMPT))  # 5 pages of 6
    run(engine, greedy("b", list(range(400, 480))))  # needs the device: a's pages leave for host
    assert writers and all(name.startswith("kvengine-demote") for name in writers), writers
    assert tier_usage(engine)["host"] == len(writers)
    out = run(engine, greedy("a2", PROMPT))["a2"]
    assert tokens(out) == reference
    assert out[-1].cached_tokens_by_tier.get("host", 0) > 0
    engine.close()


def test_host_store_rows_are_preallocated_copies_and_the_slab_grows_past_its_budget():
    store = HostStore(capacity=2, page_bytes=8)
    rows = [torch.full((8,), i, dtype=torch.uint8) for i in range(4)]
    assert all(store.put_tensor(f"k{i}", row) for i, row in enumerate(rows))  # past the 2-page budget
    held = store.get_tensor("k0")
    store.delete("k0")
    store.put_tensor("k9", torch.full((8,), 9, dtype=torch.uint8))  # reuses k0's row
    assert torch.equal(held, rows[0])  # what a restore took is a copy: unchanged
    assert store.get("k9") == bytes([9] * 8) and store.get("k0") is None and len(store) == 4
    with pytest.raises(ValueError, match="page row"):
        store.put_tensor("bad", torch.zeros(3, dtype=torch.uint8))
