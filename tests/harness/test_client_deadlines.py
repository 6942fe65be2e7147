"""The client's stall deadline is armed once per `stall_timeout_s` of streaming, not at every read: a deadline
that passes while bytes kept coming arms the next one from the last read. A stream longer than several such
deadlines is whole, and a silence after them is still the stall it is."""

from __future__ import annotations

from kvbench.harness.instrument import FAULT_STALL, InstrumentBehaviour

from .test_loadgen import run, workload


def test_a_stream_longer_than_the_stall_limit_is_not_a_stall():
    # 24 chunks 50 ms apart: 1.2 s of streaming, past the 0.4 s stall deadline three times.
    behaviour = InstrumentBehaviour(first_token_ms=5, chunk_interval_ms=50)
    result, _ = run(behaviour, workload(sessions=1, max_tokens=24), first_byte_timeout_s=0.4, stall_timeout_s=0.4)
    (rec,) = result.records
    assert rec.ok, rec.error
    assert sum(tokens for _, tokens in rec.chunks) == 24


def test_a_silence_after_several_deadlines_is_still_a_stall():
    behaviour = InstrumentBehaviour(first_token_ms=5, chunk_interval_ms=50, fault=FAULT_STALL, fault_after_chunks=16)
    result, _ = run(behaviour, workload(sessions=1, max_tokens=24), first_byte_timeout_s=0.3, stall_timeout_s=0.3)
    (rec,) = result.records
    assert rec.error == "stalled: no bytes for 0.3 s"
    assert sum(tokens for _, tokens in rec.chunks) == 16
