"""The arithmetic of an offloading connector, as vLLM and LMCache do it: what a step stores, what a lookup
loads, and when a transfer on a link is done. Pure: ints and floats in, small frozen results out.

Units are device pages (the engine's GPU blocks); a connector's block (vLLM's offloaded block, LMCache's
chunk) is `block_pages` of them.

    stored after a step   full blocks of the tokens computed so far, from the first block not yet stored
                          (vLLM `_get_reqs_to_store`: `_next_stored_block_idx` .. computed // block)
    loaded at admission   the blocks beyond the device hit, from the block the hit falls in
                          (`get_num_new_matched_tokens`: start = computed // block); the device's own pages of
                          that block are not loaded again. Less than one block's worth: nothing
    a transfer            one link per direction, first come first (vLLM's worker runs its loads on one CUDA
                          stream and its stores on another): it starts when the link is free and the data is
                          ready, and lasts bytes / bandwidth after the link's latency
"""

from __future__ import annotations

from dataclasses import dataclass


def stored_upto(computed_pages: int, stored_pages: int, block_pages: int) -> int:
    """Pages stored once a step has computed `computed_pages` of a sequence whose first `stored_pages` are
    stored: whole blocks only (`stored_pages` itself when no new block is complete)."""
    return max(stored_pages, computed_pages // block_pages * block_pages)


def loadable_pages(device_pages: int, tier_pages: int, block_pages: int, min_block: bool = True) -> int:
    """Pages a load brings beyond the device's `device_pages`, when the tier holds the first `tier_pages` of
    the prompt: the tier's whole blocks past the device hit. `min_block` (vLLM): less than one block, none."""
    upto = tier_pages // block_pages * block_pages
    extra = upto - device_pages
    if extra <= 0 or (min_block and extra < block_pages):
        return 0
    return extra


@dataclass(frozen=True, slots=True)
class Transfer:
    """One transfer on a link: it began at `start` and is done at `done`."""

    start: float
    done: float


@dataclass(slots=True)
class LinkQueue:
    """A link that carries one transfer at a time, first come first (`free_at`: when the last one is done)."""

    free_at: float = 0.0
    busy_s: float = 0.0

    def send(self, ready: float, seconds: float) -> Transfer:
        """A transfer of `seconds` whose data is ready at `ready`: queued behind the ones before it."""
        start = max(ready, self.free_at)
        self.free_at = start + seconds
        self.busy_s += seconds
        return Transfer(start, self.free_at)
