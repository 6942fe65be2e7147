"""The run folder: entries written before this module still read, entries round-trip, folders open as asked."""

import json
from pathlib import Path

import pytest
import yaml

from kvbench.measure.answer import FailureKind
from kvbench.measure.metrics import SLO
from kvbench.measure.records import PointId, RecordWriter, RequestRecord
from kvbench.measure.run_folder import (
    CONFIG_YAML,
    INTERRUPTED,
    REQUESTS_JSONL,
    SUMMARY_JSON,
    RunEntry,
    RunFolderError,
    RunMode,
    engine_dir,
    read_entries,
    read_run_folder,
    write_entries,
)
from kvbench.measure.run_open import RunFolderInUse, open_run_dir

RESULTS = Path(__file__).resolve().parents[2] / "results"
OLD_FOLDERS = [
    RESULTS / "baselines" / "nightly-cpu",
    RESULTS / "sim" / "validation" / "calibration-run",
    RESULTS / "sim" / "validation" / "validation-run",
]
MS = 1_000_000


@pytest.mark.parametrize("run_dir", OLD_FOLDERS, ids=lambda path: path.name)
def test_folders_written_before_the_entry_type_read_and_write_back_the_same_keys(run_dir):
    raw = json.loads((run_dir / SUMMARY_JSON).read_text())["runs"]
    folder = read_run_folder(run_dir)
    assert [entry.run_id for entry in folder.entries] == [item["run_id"] for item in raw]
    assert all(entry.run_id in folder.records for entry in folder.entries)
    assert folder.config and folder.env
    for item, entry in zip(raw, folder.entries):
        written = entry.to_json()
        assert {key: written[key] for key in item} == item  # nothing read is lost or changed
        assert written["invalid_reasons"] == [] and written["interrupted"] is False  # what those versions meant


def test_an_entry_from_before_invalid_reasons_names_what_it_recorded():
    old = {
        "run_id": "e|w|c1|r0",
        "engine": "e",
        "workload": "w",
        "load": "c1",
        "summary": {},
        "valid": False,
        "aborted": "engine unreachable",
        "client": {"valid": False, "reason": "loop lag 80 ms"},
    }
    entry = RunEntry.from_json(old)
    assert entry.invalid_reasons == ("aborted: engine unreachable", "client lag: loop lag 80 ms")
    assert entry.kv_dtype == "unknown" and entry.started_at is None and entry.repeat == 0


def record(run_id, index, error=None):
    sent = index * 100 * MS
    return RequestRecord(
        run_id=run_id,
        request_id=f"q{index}",
        session_id=f"s{index}",
        tenant="a",
        turn=0,
        queued_ns=sent,
        sent_ns=sent,
        first_token_ns=sent + 10 * MS,
        done_ns=sent + 30 * MS,
        chunks=[[sent + 10 * MS, 1], [sent + 30 * MS, 1]],
        prompt_tokens=8,
        output_tokens=2,
        cached_tokens=4,
        reusable_tokens=4,
        error=error,
        answer_source="token_ids",
        error_kind=FailureKind.HTTP if error else None,
        answer_tokens=None if error else [1, 2],
    )


def test_an_entry_is_built_from_its_records_and_round_trips(tmp_path):
    point = PointId("ours[kv=fp8]", "rag-chat-mini", "c2", 1)
    records = [record(point.run_id, i) for i in range(3)] + [record(point.run_id, 3, error="http: 500")]
    entry = RunEntry.of(point, records, SLO(), ["1/4 requests failed"], engine_name="kvengine", kv_dtype="fp8")
    assert (entry.run_id, entry.repeat, entry.valid, entry.interrupted) == (
        "ours[kv=fp8]|rag-chat-mini|c2|r1",
        1,
        False,
        False,
    )
    assert entry.summary["overall"]["completed"] == 3 and entry.answer_sources == {"token_ids": 3}
    write_entries(tmp_path, [entry])
    assert read_entries(tmp_path) == [entry]


def test_a_torn_or_foreign_summary_is_a_run_folder_error(tmp_path):
    with pytest.raises(RunFolderError, match="no summary.json"):
        read_entries(tmp_path)
    (tmp_path / SUMMARY_JSON).write_text('{"runs": [{"engine": "no run_id"}]}')
    with pytest.raises(RunFolderError, match="not a kvbench summary"):
        read_entries(tmp_path)


def run_folder_with(tmp_path, finished: bool):
    """A folder holding one point of two requests, its entry finished or interrupted, and a file of the user's."""
    point = PointId("e", "w", "c1", 0)
    records = [record(point.run_id, 0), record(point.run_id, 1)]
    with RecordWriter(tmp_path / REQUESTS_JSONL) as writer:
        for item in records:
            writer.write(item)
    (tmp_path / CONFIG_YAML).write_text(yaml.safe_dump({"seed": 0}))
    write_entries(tmp_path, [RunEntry.of(point, records, SLO(), aborted=None if finished else INTERRUPTED)])
    (tmp_path / "notes.txt").write_text("mine")
    engine_dir(tmp_path, "e").mkdir(parents=True)
    return point


def test_a_folder_holding_a_run_is_refused_overwritten_or_resumed(tmp_path):
    point = run_folder_with(tmp_path, finished=True)
    with pytest.raises(RunFolderInUse, match="already holds a run"):
        open_run_dir(tmp_path, {"seed": 0}, RunMode.FRESH)
    with pytest.raises(RunFolderInUse, match="differs from this run's config \\(seed\\)"):
        open_run_dir(tmp_path, {"seed": 1}, RunMode.RESUME)
    resumed = open_run_dir(tmp_path, {"seed": 0}, RunMode.RESUME)
    assert list(resumed.entries) == [point.run_id] and len(resumed.records[point.run_id]) == 2
    assert open_run_dir(tmp_path, {"seed": 0}, RunMode.OVERWRITE).entries == {}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]
    assert open_run_dir(tmp_path, {"seed": 0}, RunMode.FRESH).entries == {}  # nothing left that holds a run


def test_an_interrupted_point_is_resumed_from_its_records(tmp_path):
    point = run_folder_with(tmp_path, finished=False)
    resumed = open_run_dir(tmp_path, {"seed": 0}, RunMode.RESUME)
    assert resumed.entries == {} and [r.request_id for r in resumed.records[point.run_id]] == ["q0", "q1"]


def test_engine_folders_are_named_by_one_rule():
    assert engine_dir(Path("run"), "kvengine[kv_dtype=fp8_e4m3]") == Path("run/engines/kvengine_kv_dtype=fp8_e4m3")
    assert engine_dir(Path("run"), "fp8_e4m3/tensor") == Path("run/engines/fp8_e4m3_tensor")
    assert engine_dir(Path("run"), "[]") == Path("run/engines/engine")
