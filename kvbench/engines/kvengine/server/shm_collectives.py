"""All-reduce and all-gather for CPU tensor-parallel ranks on one host, through a shared-memory file.

Why: over gloo (TCP on loopback) one small all-reduce costs ~0.45 ms here, and a decode step of a 30-layer model
makes 62 of them (embedding, two per layer, the LM head's gather): at batch 1 that was 28 ms on top of a 40 ms
step (`benchmarks/tp_bench.py`: TP=2 at 1.68x TP=1). Here the same exchange is a copy into a shared buffer, a
counter store, a wait for the other ranks' counters and a sum: tens of microseconds. vLLM's CPU backend does
the same, with its own C++ shared-memory all-reduce; this is the torch + numpy version of it.

    file (one per engine, in /dev/shm; unlinked once every rank has mapped it)
    [ counters: one int64 per rank, a cache line apart ][ data: 2 generations x ranks x SLOT_BYTES ]

Collective number g (every rank counts the same g, since every rank makes the same calls in the same order):
each rank copies its tensor into its slot of generation g % 2, stores g in its counter, waits until every
counter is >= g, and reads every rank's slot (summing in rank order, so all ranks get the same bits). Two
generations suffice: a rank can only start writing generation g + 2 after every rank has stored g + 1, which
each does only after it has finished reading generation g. The ordering of "data, then counter" relies on
x86's total store order, so the transport is used on x86-64 only; elsewhere, on CUDA, and for a tensor larger
than a slot the exchange falls back to torch.distributed (the same calls on every rank, so the ranks agree).

A rank that dies leaves the others waiting: rank 0's watchdog (`RankProcesses`) takes the server down, and
every wait gives up with an error after `timeout_s`.
"""

from __future__ import annotations

import logging
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from kvbench.engines.kvengine.model.parallel import Collectives, DistributedCollectives

log = logging.getLogger("kvbench.serve")
SLOT_BYTES = 4 << 20  # per rank and generation: a decode batch's hidden states and logits fit, a long prefill not
_COUNTER_STRIDE = 8  # int64s between two ranks' counters: one 64-byte cache line each
_HEADER_BYTES = 4096
_SPIN = 2000  # busy checks before yielding the core (a peer is normally microseconds behind)
_TSO_MACHINES = {"x86_64", "amd64", "i386", "i686"}


def shm_dir() -> Path:
    """Where the file goes: tmpfs when there is one (no disk writes), else the temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class SharedMemoryCollectives:
    """`Collectives` over one shared file; build it with `connect` on every rank."""

    def __init__(self, rank: int, size: int, buffer: torch.Tensor, timeout_s: float, fallback: Collectives) -> None:
        self.rank, self.size, self.timeout_s, self.fallback = rank, size, timeout_s, fallback
        self._buffer = buffer  # keeps the mapping alive
        counters = buffer[:_HEADER_BYTES].view(torch.int64).numpy()
        self._counters = counters[: size * _COUNTER_STRIDE : _COUNTER_STRIDE]
        self._data = buffer[_HEADER_BYTES:].view(2, size, SLOT_BYTES)
        self._generation = 0

    @staticmethod
    def file_bytes(size: int) -> int:
        return _HEADER_BYTES + 2 * size * SLOT_BYTES

    @classmethod
    def connect(cls, rank: int, size: int, timeout_s: float) -> SharedMemoryCollectives:
        """Collective over the default process group: rank 0 creates the file (space reserved up front, so a
        small /dev/shm fails here, with OSError, not with SIGBUS later), every rank maps it, rank 0 unlinks it.
        OSError on any rank: every rank raises it (they agree whether the transport exists)."""
        path, error = None, None
        if rank == 0:
            path = shm_dir() / f"kvbench-tp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, cls.file_bytes(size))
                finally:
                    os.close(fd)
            except OSError as exc:
                path.unlink(missing_ok=True)
                path, error = None, f"{type(exc).__name__}: {exc}"
        shared = [str(path) if path else None, error]
        dist.broadcast_object_list(shared, src=0)
        if shared[0] is None:
            raise OSError(f"no shared-memory file for the tensor-parallel ranks ({shared[1]})")
        buffer = torch.from_file(shared[0], shared=True, size=cls.file_bytes(size), dtype=torch.uint8)
        dist.barrier()
        if rank == 0:
            Path(shared[0]).unlink()
        return cls(rank, size, buffer, timeout_s, DistributedCollectives())

    # ---- Collectives ----------------------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        slots = self._exchange(x)
        if slots is None:
            return self.fallback.all_reduce(x)
        flat = x.view(-1)
        torch.add(slots[0], slots[1], out=flat)
        for part in slots[2:]:
            flat.add_(part)
        return x

    def concat(self, x: torch.Tensor) -> torch.Tensor:
        slots = self._exchange(x)
        if slots is None:
            return self.fallback.concat(x)
        return torch.cat([s.view(x.shape) for s in slots], dim=-1)

    # ---- the exchange ---------------------------------------------------------------------------------------
    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Publish `x` and wait for every rank's: their slots (views), or None when `x` does not fit."""
        nbytes = x.numel() * x.element_size()
        if x.device.type != "cpu" or nbytes > SLOT_BYTES or not x.is_contiguous():
            return None
        self._generation += 1
        data = self._data[self._generation & 1]
        slots = [data[r, :nbytes].view(x.dtype) for r in range(self.size)]
        slots[self.rank].copy_(x.view(-1))
        self._counters[self.rank] = self._generation
        self._wait(self._generation)
        return slots

    def _wait(self, generation: int) -> None:
        counters = self._counters
        for _ in range(_SPIN):
            if counters.min() >= generation:
                return
        deadline = time.monotonic() + self.timeout_s
        while counters.min() < generation:
            if time.monotonic() > deadline:
                late = [r for r in range(self.size) if counters[r] < generation]
                raise RuntimeError(
                    f"tensor-parallel rank(s) {late} did not reach collective {generation} within {self.timeout_s:g} s"
                )
            os.sched_yield()


def collectives_for(device: str, rank: int, size: int, timeout_s: float) -> Collectives:
    """The fastest transport the ranks can share: shared memory for CPU ranks on x86-64, else torch.distributed
    (NCCL on CUDA, gloo on CPU). Call on every rank, after the process group is up."""
    if device.startswith("cuda") or platform.machine().lower() not in _TSO_MACHINES:
        return DistributedCollectives()
    try:
        collectives = SharedMemoryCollectives.connect(rank, size, timeout_s)
    except OSError as exc:
        log.warning("tensor-parallel ranks exchange over gloo: %s", exc)
        return DistributedCollectives()
    if rank == 0:
        log.info(
            "tensor-parallel ranks exchange through shared memory (%d MiB)",
            SharedMemoryCollectives.file_bytes(size) >> 20,
        )
    return collectives
