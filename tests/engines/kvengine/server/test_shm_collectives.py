"""The shared-memory collectives of CPU tensor-parallel ranks: two real processes over a real gloo group, checked
against sums and concatenations worked out here, through many back-to-back collectives (the two generations
of slots are reused over and over), with tensors too large for a slot (the gloo fallback); and, in one
process, the protocol against a peer played by the test, and a wait that gives up on a rank that never comes."""

from __future__ import annotations

import hashlib
import platform

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvbench.engines.kvengine.model.parallel import DistributedCollectives
from kvbench.engines.kvengine.server import shm_collectives
from kvbench.engines.kvengine.server.shm_collectives import SLOT_BYTES, SharedMemoryCollectives
from kvbench.engines.launch import free_port

ROUNDS = 120
SIZES = [1, 576, 9 * 576, SLOT_BYTES // 4 + 1]  # float32 elements; the last does not fit a slot


def _value(rank: int, i: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) * (rank + 1) + i


def _rank_main(rank: int, size: int, init_method: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=size)
    comm = SharedMemoryCollectives.connect(rank, size, timeout_s=60)
    wrong, digest = [], hashlib.sha256()
    for i in range(ROUNDS):
        n = SIZES[i % len(SIZES)]
        got = comm.all_reduce(_value(rank, i, n))
        want = sum(_value(r, i, n) for r in range(size))
        if not torch.equal(got, want):
            wrong.append(("all_reduce", i, n))
        digest.update(got.numpy().tobytes())
        part = torch.full((3, 5), float(rank * 100 + i))
        cat = comm.concat(part)
        if not torch.equal(cat, torch.cat([torch.full((3, 5), float(r * 100 + i)) for r in range(size)], -1)):
            wrong.append(("concat", i))
    dist.barrier()
    results.put((rank, wrong, digest.hexdigest(), comm._generation))
    dist.destroy_process_group()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the transport is x86-64 only")
@pytest.mark.slow
def test_two_ranks_sum_and_concatenate_through_shared_memory_and_fall_back_for_large_tensors():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, 2, init_method, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    (_, wrong0, digest0, gen0), (_, wrong1, digest1, gen1) = got
    assert wrong0 == wrong1 == []
    assert digest0 == digest1  # the same bits on both ranks
    # every concat and 3 of every 4 all-reduces went through shared memory; the too-large ones over gloo
    assert gen0 == gen1 == ROUNDS + ROUNDS * 3 // 4
    # rank 0 named the file after its pid and unlinked it once both ranks had mapped it
    assert list(shm_collectives.shm_dir().glob(f"kvbench-tp-{procs[0].pid}-*")) == []


def _lone_rank0(timeout_s: float) -> SharedMemoryCollectives:
    buffer = torch.zeros(SharedMemoryCollectives.file_bytes(2), dtype=torch.uint8)
    return SharedMemoryCollectives(0, 2, buffer, timeout_s, DistributedCollectives())


def test_a_peer_that_has_published_is_summed_in_rank_order():
    comm = _lone_rank0(timeout_s=5)
    peer = comm._data[1, 1, :16].view(torch.float32)  # generation 1 (slot parity 1), rank 1
    peer.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    comm._counters[1] = 1
    x = torch.tensor([10.0, 20.0, 30.0, 40.0])
    assert comm.all_reduce(x) is x
    assert x.tolist() == [11.0, 22.0, 33.0, 44.0]
    assert comm._counters[0] == 1  # this rank published generation 1


def test_a_rank_that_never_comes_is_named_after_the_timeout():
    comm = _lone_rank0(timeout_s=0.2)
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] did not reach collective 1 within 0.2 s"):
        comm.all_reduce(torch.ones(4))
