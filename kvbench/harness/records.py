"""Per-request records: raw timestamps as measured, nothing derived.

Every metric is computed afterwards from these records (see `metrics.py`), so a run folder's
`requests.jsonl` is the ground truth. Times are `time.perf_counter_ns()` values from the one load-generator
process; only differences between them mean anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO

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
    """

    run_id: str
    request_id: str
    session_id: str
    tenant: str
    turn: int
    queued_ns: int
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
    warmup: bool = False
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


class RecordWriter:
    """Appends records to a JSONL file and flushes each one, so a crash loses nothing already finished."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        self._file.write(record.to_json() + "\n")
        # flush, not fsync: the OS keeps the bytes if this process dies, and fsync would stall the loop.
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
