"""ShareGPT files read lazily: only as many conversations as the run needs, each bounded before it is built.

vLLM's ShareGPT file is a JSON array of records `{"id": ..., "conversations": [{"from": ..., "value": ...}]}`
(or the same records one per line, JSONL). Read through Hugging Face `datasets`, the whole file went into
Arrow first: a file of one 100 MB message held 11 GB resident and sent no request; one of 10^6
conversations was still being read at 240 s for `--num-requests 3`.

Here the file is mapped (`mmap`: only the pages read are resident), a JSON array is split into its records
without building them (msgspec's `Raw`, one linear pass), and records are decoded one at a time into a typed
schema until the caller has enough. Bounds, each refused with a WorkloadError naming it: `MAX_FILE_BYTES`
for the file, `MAX_RECORD_BYTES` for a JSONL line, `MAX_MESSAGE_CHARS` for a message's text. A record that is
not a ShareGPT record (no conversations, another shape) is skipped, as vLLM's reader skips it.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import msgspec

from kvbench.workloads.spec import WorkloadError

MAX_FILE_BYTES = 8 << 30
MAX_RECORD_BYTES = 64 << 20  # one JSONL line
MAX_MESSAGE_CHARS = 1 << 22  # a message's text: past a 1M-token context at four characters a token


class Message(msgspec.Struct, forbid_unknown_fields=False):
    value: Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE_CHARS)] | None = None
    # `from` is a keyword: renamed
    role: str | None = msgspec.field(default=None, name="from")


class Record(msgspec.Struct, forbid_unknown_fields=False):
    id: str | int | None = None
    conversations: list[Message] | None = None


def conversations(path: Path) -> Iterator[tuple[str | None, list[tuple[str | None, str]]]]:
    """(record id, [(role, text), ...]) of each ShareGPT record of `path`, in order, read as they are asked
    for; WorkloadError for a file or a message past its bound, or a file that is not JSON."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise WorkloadError(
            f"sharegpt:{path}: {size:,} bytes, more than a dataset file may hold "
            f"({MAX_FILE_BYTES:,}); take a part of it"
        )
    if size == 0:
        return
    with path.open("rb") as file:
        # Not closed here: the records (msgspec Raw) point into it; it is unmapped once the last one is gone.
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    first = next((data[i : i + 1] for i in range(min(size, 4096)) if not data[i : i + 1].isspace()), b"")
    for index, raw in _array(data, path) if first == b"[" else _lines(data, path):
        record = _record(raw, path, index)
        if record is not None and record.conversations:
            yield record.id, [(m.role, m.value) for m in record.conversations if m.value is not None]


def _array(data: mmap.mmap, path: Path) -> Iterator[tuple[int, msgspec.Raw]]:
    try:
        items = msgspec.json.decode(data, type=list[msgspec.Raw])
    except (msgspec.DecodeError, RecursionError) as exc:
        raise WorkloadError(f"sharegpt:{path}: not a JSON array of records ({str(exc)[:100]})") from None
    yield from enumerate(items)


def _lines(data: mmap.mmap, path: Path) -> Iterator[tuple[int, bytes]]:
    start, index = 0, 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end == -1 else end
        if end - start > MAX_RECORD_BYTES:
            raise WorkloadError(
                f"sharegpt:{path}: line {index + 1} holds {end - start:,} bytes, more than a record "
                f"may ({MAX_RECORD_BYTES:,}); shorten it"
            )
        line = data[start:end]
        if line.strip():
            yield index, line
        start, index = end + 1, index + 1


def _record(raw, path: Path, index: int) -> Record | None:
    """The record, None for a JSON value that is not a ShareGPT record; WorkloadError past a bound."""
    try:
        return msgspec.json.decode(raw, type=Record)
    except msgspec.ValidationError as exc:
        if "length <=" in str(exc):
            raise WorkloadError(
                f"sharegpt:{path}: record {index}: a message of more than {MAX_MESSAGE_CHARS:,} characters; shorten it"
            ) from None
        return None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise WorkloadError(f"sharegpt:{path}: record {index} is not JSON ({str(exc)[:100]})") from None
