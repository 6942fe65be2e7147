"""How the load generator's event loop runs: uvloop when installed, and no cyclic GC pauses mid-run."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import TypeVar

T = TypeVar("T")


def run(coroutine: Coroutine[object, object, T]) -> T:
    """`asyncio.run` on uvloop if it is installed (`pip install kvbench[fast]`).

    The cyclic garbage collector is paused for the run: a full collection over the records and buffers a
    long run accumulates stalls the loop for milliseconds, which would show up as schedule lag and TTFT.
    Reference counting still frees everything that is not in a cycle; one collection runs afterwards.
    """
    gc.collect()
    gc.freeze()
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(coroutine)
        return uvloop.run(coroutine)
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()
        gc.collect()


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
