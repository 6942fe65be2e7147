"""The request record has one builder (`measure.record_builder`): every field comes from the asking, the
transport's answer and the next turn, and no other module of kvbench sets a record's field (read from the source,
by AST: an assignment, an augmented assignment or a `setattr` to a field name on anything but `self`, outside
records.py and record_builder.py)."""

from __future__ import annotations

import ast
import json
from dataclasses import fields

from kvbench.measure.answer import Answer, Failure, FailureKind, Usage
from kvbench.measure.record_builder import Asked, NextTurn, build_record, with_reusable_tokens
from kvbench.measure.records import ANSWER_TOKEN_IDS, RequestRecord
from tests.paths import REPO

RECORD_FIELDS = {f.name for f in fields(RequestRecord)}
OWNERS = {"kvbench/measure/records.py", "kvbench/measure/record_builder.py"}
# Transports' own progress objects, which share a few field names with the record (when a request was sent, its
# first token): the client's `_Exchange` and the simulator's `_Live` (by the name they go by there).
PROGRESS = {("kvbench/harness/client.py", "exchange"), ("kvbench/sim/engine.py", "live")}
ASKED = Asked(
    "run", "s/1", "s", "t", 1, queued_ns=10, planned_ns=5, prompt_len_sent=40, reusable_tokens=32, warmup=False
)


def _field_writes(tree: ast.AST, progress: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, field) of each write of a record field name to an attribute of anything but `self` (and the names
    in `progress`)."""
    own = {"self", *progress}
    writes = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in RECORD_FIELDS
        ):
            writes.append((node.lineno, node.args[1].value))
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and sub.attr in RECORD_FIELDS
                    and not (isinstance(sub.value, ast.Name) and sub.value.id in own)
                ):
                    writes.append((sub.lineno, sub.attr))
    return writes


def test_no_module_but_the_builder_sets_a_records_field():
    found = []
    for path in sorted((REPO / "kvbench").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name not in OWNERS:
            progress = frozenset(receiver for module, receiver in PROGRESS if module == name)
            found += [
                f"{name}:{line} sets .{attr}" for line, attr in _field_writes(ast.parse(path.read_text()), progress)
            ]
    assert found == []


def test_the_check_sees_each_kind_of_write():
    source = """
record.error = "x"
live.record.chunks += [[1, 1]]
setattr(rec, "done_ns", 3)
self.error = "mine"
other.unrelated = 1
"""
    assert sorted(attr for _, attr in _field_writes(ast.parse(source))) == ["chunks", "done_ns", "error"]


def test_a_record_is_its_asking_and_its_answer():
    chunks = [[30, 1], [50, 2]]
    answer = Answer(
        sent_ns=12,
        http_status=200,
        first_token_ns=30,
        done_ns=60,
        chunks=chunks,
        usage=Usage(40, 3, 16, {"cpu": 8}),
        finish_reason="length",
        text=" a b",
        token_ids=[4, 5, 6],
    )
    record = build_record(ASKED, answer, NextTurn(ANSWER_TOKEN_IDS, [4, 5, 6], " a b"))
    assert (record.run_id, record.request_id, record.session_id, record.tenant, record.turn) == (
        "run",
        "s/1",
        "s",
        "t",
        1,
    )
    assert (record.planned_ns, record.queued_ns, record.sent_ns, record.first_token_ns, record.done_ns) == (
        5,
        10,
        12,
        30,
        60,
    )
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens) == (40, 3, 16)
    assert record.cached_tokens_by_tier == {"cpu": 8} and record.chunks == chunks
    assert (record.prompt_len_sent, record.reusable_tokens, record.warmup) == (40, 32, False)
    assert (record.answer_source, record.answer_tokens, record.answer_text) == (ANSWER_TOKEN_IDS, [4, 5, 6], " a b")
    assert record.ok and record.error is None and record.error_kind is None and record.finish_reason == "length"


def test_a_failed_answer_is_an_error_with_its_kind_and_missing_counts_stay_missing():
    answer = Answer(sent_ns=12, http_status=503, done_ns=20, failure=Failure(FailureKind.HTTP, "503 busy"))
    record = build_record(ASKED, answer)
    assert not record.ok and record.error == "http: 503 busy" and record.error_kind is FailureKind.HTTP
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens, record.first_token_ns) == (None,) * 4
    assert record.chunks == [] and record.answer_tokens is None
    again = RequestRecord.from_dict(json.loads(record.to_json()))
    assert again == record and again.error_kind is FailureKind.HTTP


def test_a_record_written_before_the_kind_field_reads_its_kind_from_its_error():
    old = {
        "run_id": "r",
        "request_id": "q",
        "session_id": "s",
        "tenant": "t",
        "turn": 0,
        "queued_ns": 0,
        "error": "timeout: no first byte within 300 s",
    }
    assert RequestRecord.from_dict(old).error_kind is FailureKind.TIMEOUT


def test_a_replayed_record_carries_this_processs_reusable_count_and_is_otherwise_the_same():
    record = build_record(ASKED, Answer(sent_ns=1, done_ns=2, chunks=[[2, 1]]))
    replayed = with_reusable_tokens(record, 7)
    assert replayed.reusable_tokens == 7 and record.reusable_tokens == 32
    assert {f: getattr(replayed, f) for f in RECORD_FIELDS - {"reusable_tokens"}} == {
        f: getattr(record, f) for f in RECORD_FIELDS - {"reusable_tokens"}
    }
