"""A tensor-parallel worker rank (1..N-1) of `kvbench serve`, launched by `server/ranks.py`: it loads its shard
and carries out the ops rank 0 writes to its stdin until EOF. Its stdout and stderr are the server's."""

from __future__ import annotations

import argparse
import logging
import pickle
import sys

from kvbench.engines.kvengine.settings import openmp
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.engines.kvengine.settings.flags import add_flags, from_args

EXIT_FAILED = 1


def main(argv: list[str] | None = None) -> int:
    openmp.apply()
    parser = argparse.ArgumentParser(prog="kvengine worker rank", description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--init-method", required=True, help="the process group's rendezvous (tcp://host:port)")
    add_flags(parser, EngineConfig)
    args = parser.parse_args(argv)
    config = from_args(EngineConfig, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("kvbench.serve")
    try:
        import torch

        from kvbench.engines.kvengine.runtime.model_runner import (
            TORCH_COMPUTE_DTYPES,
            build_runner,
            load_rank_model,
            rank_device,
            serve_ops,
        )
        from kvbench.engines.kvengine.server.ranks import init_rank

        if config.threads:
            torch.set_num_threads(config.threads)
        parallel = init_rank(config.device, args.rank, config.tensor_parallel_size, args.init_method)
        loaded = load_rank_model(config, parallel)
        device = rank_device(config.device, args.rank)
        runner = build_runner(config, loaded, TORCH_COMPUTE_DTYPES[config.compute_dtype], device)
        serve_ops(runner, _reader(sys.stdin.buffer))
    except BaseException as exc:  # noqa: BLE001 - whatever it is, rank 0 must learn that this rank is gone
        log.error("tensor-parallel rank %d failed: %s: %s", args.rank, type(exc).__name__, exc)
        return EXIT_FAILED
    return 0


def _reader(stream):
    def receive():
        try:
            return pickle.load(stream)
        except EOFError:  # rank 0 closed the pipe (done) or died
            return None

    return receive


if __name__ == "__main__":
    raise SystemExit(main())
