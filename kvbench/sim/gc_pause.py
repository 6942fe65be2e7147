"""The cyclic garbage collector paused around a simulation (`engine.simulate`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, then as it was. A simulation allocates millions
    of small containers (plans, chunk lists, heap entries) and frees them by reference counting; the
    collector's passes over everything still alive (the records, the radix tree) were over a tenth of a long
    run's CPU time, for a few thousand cyclic objects (split radix nodes) that the next pass after it frees.

    On the way out, what the block allocated goes straight to the oldest generation (`freeze` then `unfreeze`
    moves it there without a pass): else the first young collection after it walked every record and chunk
    list made meanwhile, and the next one again (0.3 s after a 12,000-request run)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()
