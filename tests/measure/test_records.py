"""The record file: a torn last line (a writer killed mid-write) never corrupts the records after it."""

from __future__ import annotations

import pytest

from kvbench.measure.records import PointId, RecordWriter, RequestRecord, read_records


def test_a_writer_reopening_a_torn_file_starts_its_records_on_their_own_line(tmp_path):
    path = tmp_path / "requests.jsonl"
    first = RequestRecord("p", "s0/0", "s0", "t", 0, queued_ns=1)
    path.write_text(first.to_json() + "\n" + first.to_json()[:25])  # killed halfway through the second record
    with RecordWriter(path) as writer:
        writer.write(RequestRecord("p", "s1/0", "s1", "t", 0, queued_ns=2))
    assert [record.session_id for record in read_records(path)] == ["s0", "s1"]


def test_point_ids_round_trip_through_their_run_id_even_with_bars_in_the_engine_label():
    point = PointId("vllm[a|b]", "rag-chat-mini", "conc=4", 2)
    assert point.run_id == "vllm[a|b]|rag-chat-mini|conc=4|r2"
    assert PointId.parse(point.run_id) == point
    with pytest.raises(ValueError, match="does not end in"):
        PointId.parse("a|b|c|d")
