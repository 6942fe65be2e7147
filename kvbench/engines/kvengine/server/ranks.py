"""The tensor-parallel ranks of one engine as processes: rank 0 is this process (the scheduler and the HTTP
server); ranks 1..N-1 are children (`server/worker.py`), each on its own device.

    rank 0 (kvbench serve)                      rank r (python -m ...server.worker --rank r ...)
    start(): launch ranks 1..N-1 ------------->  init_process_group(rank r)
             init_process_group(rank 0)          load its shard, calibrate (collectives meet rank 0's)
    Engine(config, ranks)                        loop: op = read(stdin) -> runner.execute(op)
    each op: pickle -> every worker's stdin ---> (EOF: rank 0 is gone or done -> exit 0)

Collectives (all-reduce, all-gather) go over torch.distributed (NCCL on CUDA), or for CPU ranks through shared
memory (`shm_collectives.py`; gloo for what does not fit there). The ops themselves
go down each worker's stdin, so an idle server waits on a pipe, not on a collective that could time out.

Failure: a watchdog thread polls the workers; one that exits while the engine runs is reported by `on_exit`
(rank, pid, exit code), and the server goes down with a log line naming the rank. Workers get SIGTERM when
rank 0 dies (`PR_SET_PDEATHSIG`) and EOF on stdin when it closes them; they run in a session of their own, so
a signal to the server's process group reaches rank 0 alone, which then closes them.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from kvbench.engines.kvengine.settings import openmp
from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig
from kvbench.engines.kvengine.settings.flags import to_argv
from kvbench.engines.launch import free_port
from kvbench.engines.process import dies_with_this_thread
from kvbench.settings import SettingsError

log = logging.getLogger("kvbench.serve")
WORKER_MODULE = "kvbench.engines.kvengine.server.worker"
POLL_S = 0.2  # how often the watchdog looks at the workers
CLOSE_GRACE_S = 10.0  # how long a closed worker may take to exit before it is killed
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)  # loading a large shard can take minutes


def backend_of(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def init_rank(device: str, rank: int, world_size: int, init_method: str):
    """Join the engine's process group (every rank calls it; rank 0 hosts the rendezvous); returns this rank's
    `TensorParallel`, with the fastest collectives the ranks share (`shm_collectives.collectives_for`)."""
    import torch
    import torch.distributed as dist

    from kvbench.engines.kvengine.model.parallel import TensorParallel
    from kvbench.engines.kvengine.runtime.model_runner import rank_device
    from kvbench.engines.kvengine.server.shm_collectives import collectives_for

    if device.startswith("cuda"):
        torch.cuda.set_device(rank_device(device, rank))
    dist.init_process_group(
        backend_of(device), init_method=init_method, rank=rank, world_size=world_size, timeout=RENDEZVOUS_TIMEOUT
    )
    collectives = collectives_for(device, rank, world_size, RENDEZVOUS_TIMEOUT.total_seconds())
    return TensorParallel(rank, world_size, collectives)


class RankProcesses:
    """Ranks 1..N-1 of `config.tensor_parallel_size` as child processes; this process is rank 0."""

    def __init__(self, config: EngineConfig) -> None:
        """SettingsError, before anything starts, for settings that need a single rank."""
        if config.host_capacity or config.disk_capacity or config.remote_url:
            raise SettingsError(
                f"tensor_parallel_size {config.tensor_parallel_size} with lower KV tiers "
                "(host_capacity, disk_capacity, remote_url) is not supported yet: use "
                "tensor_parallel_size 1 with them"
            )
        if config.kv_capacity == AUTO and config.kv_capacity_bytes is None:
            # every rank must allocate the same pages: rank 0 sizes them once (`fit_memory`), before the start
            raise ValueError("RankProcesses needs kv_capacity resolved to tokens (memory_budget.fit_memory)")
        self.config = config
        self.world_size = config.tensor_parallel_size
        self._workers: dict[int, subprocess.Popen] = {}
        self._closing = threading.Event()
        self._send_lock = threading.Lock()

    def start(self, on_exit: Callable[[int, int, int], None]):
        """Launch the workers, watch them (`on_exit(rank, pid, code)` from a daemon thread when one exits before
        `close`, from the start: a worker that fails to load is reported while rank 0 waits for it), and join
        the process group as rank 0; returns the engine's `Ranks`."""
        from kvbench.engines.kvengine.runtime.model_runner import Ranks

        init_method = f"tcp://127.0.0.1:{free_port()}"
        argv = to_argv(self.config)
        for rank in range(1, self.world_size):
            command = [sys.executable, "-m", WORKER_MODULE, "--rank", str(rank), "--init-method", init_method, *argv]
            self._workers[rank] = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=dies_with_this_thread(),
                env={**os.environ, **openmp.environment()},
            )
            log.info("tensor-parallel rank %d started (pid %d)", rank, self._workers[rank].pid)
        self._watch(on_exit)
        return Ranks(init_rank(self.config.device, 0, self.world_size, init_method), self.send)

    @property
    def pids(self) -> dict[int, int]:
        return {rank: process.pid for rank, process in self._workers.items()}

    def send(self, op: object) -> None:
        """One op to every worker, in rank order (BrokenPipeError: a worker is gone; the watchdog says which)."""
        data = pickle.dumps(op, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            for process in self._workers.values():
                assert process.stdin is not None
                process.stdin.write(data)
                process.stdin.flush()

    def _watch(self, on_exit: Callable[[int, int, int], None]) -> None:

        def poll() -> None:
            while not self._closing.is_set():
                for rank, process in self._workers.items():
                    code = process.poll()
                    if code is not None and not self._closing.is_set():
                        on_exit(rank, process.pid, code)
                        return
                time.sleep(POLL_S)

        threading.Thread(target=poll, name="kvengine-ranks", daemon=True).start()

    def close(self) -> None:
        """End the workers: EOF on their stdin, then SIGKILL after CLOSE_GRACE_S."""
        self._closing.set()
        for process in self._workers.values():
            try:
                process.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + CLOSE_GRACE_S
        for process in self._workers.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
