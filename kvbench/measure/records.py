"""Per-request records: raw timestamps as measured, nothing derived.

Every metric is computed afterwards from these records (see `metrics.py`), so a run folder's
`requests.jsonl` is the ground truth. Times are `time.perf_counter_ns()` values; only differences between
them mean anything. A request's own latencies are differences on the clock of the one worker process that
sent it; records of several load workers (`kvbench run --workers`, `--ray`) are put on the driver's
perf_counter by each worker's wall-clock offset (`shift_times`), so that spans across records (a run's
duration) compare requests of different workers as well as the machines' wall clocks agree.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO

from kvbench.measure.answer import FailureKind
from kvbench.measure.write_errors import writing

# How the next turn's copy of an answer was obtained (DESIGN: real ids, else re-tokenized, else placeholders).
ANSWER_TOKEN_IDS = "token_ids"
ANSWER_RETOKENIZED = "retokenized"
ANSWER_PLACEHOLDER = "placeholder"


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request.

    `chunks` holds `[arrival_ns, tokens]` for every streamed chunk that carried output tokens; a chunk with k
    tokens contributes k inter-token gaps of gap/k. Counts are the server's `usage`; `None` means the server
    did not say (missing is never 0). `error` is set when the request failed; its timings are then partial.
    `planned_ns` is when the schedule meant the request to go (a session's arrival, or the previous answer plus
    the think time), `queued_ns` when it could go (in a closed loop, once a slot freed up) and `sent_ns` when it
    went: latencies from `planned_ns` count the waits a saturated client or closed loop adds (coordinated
    omission); records written before the field existed have None.
    `answer_tokens` are the token ids the session's next prompt carries as this turn's answer (`answer_source`
    says where they came from) and `answer_text` the answer text a chat session carries: with them a resumed
    run sends the next turn exactly as the interrupted run would have.
    """

    run_id: str
    request_id: str
    session_id: str
    tenant: str
    turn: int
    queued_ns: int
    planned_ns: int | None = None  # when the schedule meant it to be sent (before any wait for a slot or the client)
    sent_ns: int | None = None
    first_token_ns: int | None = None
    done_ns: int | None = None
    chunks: list[list[int]] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cached_tokens_by_tier: dict[str, int] | None = None
    prompt_len_sent: int = 0
    reusable_tokens: int = 0
    answer_source: str | None = None
    http_status: int | None = None
    error: str | None = None
    error_kind: FailureKind | None = None  # set with `error`: why it failed, as a value (the text before ':')
    warmup: bool = False
    finish_reason: str | None = None
    answer_tokens: list[int] | None = None
    answer_text: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def identity(self) -> tuple[str, str, int]:
        """What makes a request the same request in another process: its point, session and turn."""
        return (self.run_id, self.session_id, self.turn)

    def shift_times(self, delta_ns: int) -> None:
        """Move every timestamp by `delta_ns` (onto another process's perf_counter): differences are kept."""
        for name in ("queued_ns", "planned_ns", "sent_ns", "first_token_ns", "done_ns"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value + delta_ns)
        self.chunks = [[arrival_ns + delta_ns, tokens] for arrival_ns, tokens in self.chunks]

    def to_json(self) -> str:
        return _encode(self._fields())

    def _fields(self) -> dict:
        # The fields as they are, not `asdict`: every value is JSON already, and asdict's deep copy of the
        # chunk lists (one per output token) made writing records cost as much as simulating them.
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRecord":
        values = {key: value for key, value in data.items() if key in _FIELD_SET}
        kind = values.get("error_kind")
        if "error_kind" not in values and values.get("error") is not None:
            kind = values["error"].partition(":")[0]  # a record written before the field: its error's prefix
        values["error_kind"] = None if kind is None else _failure_kind(kind)
        return cls(**values)


_FIELD_NAMES = tuple(f.name for f in fields(RequestRecord))
_FIELD_SET = frozenset(_FIELD_NAMES)


def _failure_kind(kind: str) -> FailureKind | str:
    """A failure kind read back from a file: its value, or the text as written by a kvbench that had others."""
    try:
        return FailureKind(kind)
    except ValueError:
        return kind


# What `to_json` and `jsonl_lines` write with. A record is a tree of plain values (never a cycle): without the
# encoder's cycle check, half the time.
_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
# Stands for the chunks in `jsonl_lines`; once encoded ("\\u0000..."), no other value can encode to it.
_CHUNKS_MARK = "\x00chunks\x00"
_CHUNKS_MARK_JSON = json.dumps(_CHUNKS_MARK)


def jsonl_lines(records: Iterable[RequestRecord]) -> Iterator[str]:
    """Each record's `to_json()`, the same text, with every chunk list object encoded once however many of
    the records hold it: the simulator streams one list per step to every sequence in the step, and encoding
    the same lists again was nine tenths of writing a simulated run's records."""
    texts: dict[int, str] = {}
    get = texts.get
    alive: list[list[list[int]]] = []  # the records' chunk lists: no id in `texts` is reused while it runs
    for record in records:
        chunks = record.chunks
        alive.append(chunks)
        parts = [get(i) for i in map(id, chunks)]
        k = -1
        for _ in range(parts.count(None)):  # the chunk lists not met before, found at C speed
            k = parts.index(None, k + 1)
            chunk = chunks[k]
            parts[k] = texts[id(chunk)] = (
                f"[{chunk[0]},{chunk[1]}]"  # what the encoder writes for two ints, without its setup per call
                if len(chunk) == 2 and type(chunk[0]) is int and type(chunk[1]) is int
                else _encode(chunk)
            )
        doc = record._fields()
        doc["chunks"] = _CHUNKS_MARK
        yield _encode(doc).replace(_CHUNKS_MARK_JSON, "[" + ",".join(parts) + "]", 1)


@dataclass(frozen=True)
class PointId:
    """Which load point a record belongs to; its `run_id` reads `engine|workload|load|rN`."""

    engine: str
    workload: str
    load: str
    repeat: int

    @property
    def run_id(self) -> str:
        return f"{self.engine}|{self.workload}|{self.load}|r{self.repeat}"

    @classmethod
    def parse(cls, run_id: str) -> "PointId":
        """The inverse of `run_id` (engine labels may hold '|'; workload and load names do not)."""
        engine, workload, load, repeat = run_id.rsplit("|", 3)
        if not repeat.startswith("r") or not repeat[1:].isdigit():
            raise ValueError(f"run_id {run_id!r} does not end in |rN")
        return cls(engine, workload, load, int(repeat[1:]))


class RecordWriter:
    """Appends records to a JSONL file and flushes each one, so a crash loses nothing already finished.

    A torn last line left by a writer killed mid-write is cut off first, so the next record starts a line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            _cut_torn_tail(path)
            # Unbuffered: each write goes to the OS at once (it keeps the bytes if this process dies; fsync would
            # stall the loop), and nothing is left in a buffer to be half-written later on a full disk.
            self._file: IO[bytes] = path.open("ab", buffering=0)
        self._end = self._file.seek(0, os.SEEK_END)  # where the last whole record ends

    def write(self, record: RequestRecord) -> None:
        self._append((record.to_json() + "\n").encode())

    def write_all(self, records: Iterable[RequestRecord]) -> None:
        """`write` of each record, the same lines (`jsonl_lines`), in one write: for records that exist
        already (a simulation's), where nothing is measured meanwhile."""
        self._append("".join(line + "\n" for line in jsonl_lines(records)).encode())

    def _append(self, data: bytes) -> None:
        """All of `data` or none of it: a write that fails part way (a full disk) is cut back to the last whole
        record, so the records flushed so far stay readable, and raises RunWriteError."""
        with writing(self.path):
            try:
                view = memoryview(data)
                while view:
                    view = view[self._file.write(view) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.truncate(self._file.fileno(), self._end)
                raise
        self._end += len(data)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cut_torn_tail(path: Path, block: int = 1 << 16) -> None:
    """Truncate `path` after its last newline (reading back from the end, not the whole file)."""
    if not path.exists():
        return
    with path.open("rb+") as handle:
        end = position = handle.seek(0, os.SEEK_END)
        while position > 0:
            start = max(position - block, 0)
            handle.seek(start)
            data = handle.read(position - start)
            newline = data.rfind(b"\n")
            if newline >= 0:
                if start + newline + 1 < end:
                    handle.truncate(start + newline + 1)
                return
            position = start
        handle.truncate(0)  # one torn line and nothing before it


def read_records(path: Path) -> Iterator[RequestRecord]:
    """Records of a `requests.jsonl`; a torn last line (the writer was killed mid-write) is skipped."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            yield RequestRecord.from_dict(data)
