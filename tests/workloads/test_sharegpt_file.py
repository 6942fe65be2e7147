"""ShareGPT files read lazily and bounded (issue 46): before, one 100 MB message held 11 GB resident and
10^6 conversations were still being read at 240 s for `--num-requests 3`."""

from __future__ import annotations

import json

import pytest

from kvbench.workloads.profiles import load_workload
from kvbench.workloads.sharegpt_file import MAX_MESSAGE_CHARS, conversations
from kvbench.workloads.spec import WorkloadError

from .test_text_datasets import TOKENIZER


def record(i: int, answer: str = "the cache keeps every page") -> dict:
    return {
        "id": f"c{i}",
        "conversations": [{"from": "human", "value": f"hello world {i}"}, {"from": "gpt", "value": answer}],
    }


def load(path, **kwargs):
    return load_workload(f"sharegpt:{path}", overrides={"tokenizer": TOKENIZER}, **kwargs)


@pytest.mark.parametrize("suffix", ["json", "jsonl"])
def test_only_the_conversations_a_run_needs_are_read(tmp_path, suffix):
    """Past the third record the file holds a message over the bound: three sessions never reach it."""
    records = [record(i) for i in range(3)] + [record(3, "x" * (MAX_MESSAGE_CHARS + 1))]
    path = tmp_path / f"chats.{suffix}"
    path.write_text(json.dumps(records) if suffix == "json" else "\n".join(map(json.dumps, records)))
    workload = load(path, num_sessions=3)
    assert [session.session_id for session in workload.sessions] == ["c0", "c1", "c2"]
    with pytest.raises(WorkloadError, match=f"record 3: a message of more than {MAX_MESSAGE_CHARS:,} characters"):
        load(path)


def test_a_jsonl_file_is_read_no_further_than_asked(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(map(json.dumps, [record(i) for i in range(2)])) + "\n{not json at all\n")
    assert len(load(path, num_sessions=2).sessions) == 2
    with pytest.raises(WorkloadError, match="record 2 is not JSON"):
        load(path)


@pytest.mark.parametrize("text", ['{"a": 1}', "[1, 2, [3]]", '[{"conversations": "x"}, {"id": 2}]', "[" * 100_000])
def test_any_json_is_skipped_record_by_record_or_refused_in_one_line(tmp_path, text):
    path = tmp_path / "odd.json"
    path.write_text(text)
    try:
        assert list(conversations(path)) == []
    except WorkloadError as exc:
        assert "\n" not in str(exc) and "odd.json" in str(exc)


def test_a_run_reads_no_more_conversations_than_its_requests(tmp_path):
    """`--num-requests 3` against 10^6 conversations tokenised every one of them: the run's workload spec reads
    only as many as the most requests a point sends when num_sessions is not given."""
    from kvbench.harness.config import WorkloadSpec

    records = [record(i) for i in range(3)] + [record(3, "x" * (MAX_MESSAGE_CHARS + 1))]
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(map(json.dumps, records)))
    spec = WorkloadSpec(name=f"sharegpt:{path}", overrides={"tokenizer": TOKENIZER})
    assert len(spec.load(0, sessions_needed=3).sessions) == 3
    with pytest.raises(WorkloadError, match="record 3"):
        spec.load(0)
