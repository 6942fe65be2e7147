"""Parking: a sequence set aside while its output cannot be delivered (a streaming client that stopped reading).

    running --park--> parked --resume--> waiting (first in line) --schedule--> running
                        |
                        +--finish (its client was given up on)--> gone

A parked sequence holds no batch slot (it is not counted against `max_num_seqs`) and no device page: parking
releases its pages as a recompute preemption does (its computed full pages enter the prefix index, cached and
evictable), so that clients that never read can hold neither the slots nor the pages that others need. On
resume it is readmitted before any waiting request and finds its pages in the prefix index unless they were
evicted meanwhile (then they are recomputed). How long a sequence may stay parked is its caller's rule (the
server ends a stream whose client has read nothing for its stall timeout). `Scheduler` inherits these; the
sequences and `_release` are the scheduler's.
"""

from __future__ import annotations

from kvbench.engines.kvengine.core.plans import RequestId


class Parking:
    """`park`, `resume` and `num_parked` of Scheduler (whose state they use; see the module docstring)."""

    __slots__ = ()

    @property
    def num_parked(self) -> int:
        return len(self._parked)

    def park(self, request_id: RequestId, now: float) -> bool:
        """Set a running or waiting request aside, its device pages released (cached where computed). False if
        it is not here (finished, or still restoring from a lower tier) or already parked. Between steps only."""
        seq = self._seqs.get(request_id)
        if seq is None or request_id in self._parked:
            return False
        if seq in self._running:
            self._running.remove(seq)
            self._release(seq, now, cache=True)
            seq.num_computed = 0  # recomputed from the prefix index on resume
        else:
            self._waiting.remove(seq)  # a waiting sequence holds no device pages (a swapped one keeps its host copy)
        self._parked[request_id] = seq
        return True

    def resume(self, request_id: RequestId) -> bool:
        """Put a parked request back, first in line for admission. False if it is not parked."""
        seq = self._parked.pop(request_id, None)
        if seq is None:
            return False
        self._waiting.appendleft(seq)
        return True
