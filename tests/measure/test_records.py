"""The record file: a torn last line (a writer killed mid-write) never corrupts the records after it."""

from __future__ import annotations

import pytest

from kvbench.measure.answer import FailureKind
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


def test_jsonl_lines_write_what_to_json_writes_for_shared_and_odd_chunks(tmp_path):
    from kvbench.measure.records import jsonl_lines

    step = [[1_700_000_000_123, 1], [1_700_000_000_456, 1]]  # one list per step, shared as the simulator does
    records = [RequestRecord("p", f"s{k}/0", f"s{k}", "t", 0, queued_ns=k, chunks=list(step)) for k in range(3)]
    records[1].chunks += [[5, 2], [6.5, 1], [True, 1], [7, 1, 9]]  # a float, a bool, three ints: the encoder's
    records[2].chunks = []
    records[2].error = 'http: 500 "\x00chunks\x00"'  # a value that looks like the stand-in once quoted
    records[2].error_kind = FailureKind.HTTP
    records[0].cached_tokens_by_tier = {"device": 3}
    assert list(jsonl_lines(records)) == [r.to_json() for r in records]
    path = tmp_path / "requests.jsonl"
    with RecordWriter(path) as writer:
        writer.write_all(records)
    assert [r.to_json() for r in read_records(path)] == [r.to_json() for r in records]
