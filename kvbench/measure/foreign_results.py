"""Result files of other benchmarks read into rows of kvbench's summary table, so `kvbench report` puts them
beside our run folders, labelled by the tool that wrote them:

- `vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py's `result_json`; our `vllm/<point>.json` too);
- AIPerf's `profile_export_aiperf.json` (or the artifact folder holding it);
- guidellm's `benchmarks.json` (`guidellm run --output kind=json`), one row per benchmark in it;
- an llm-d benchmark report (llmd_results.py) and inference-perf's lifecycle metrics (inference_perf_results.py).

The mapping from their key names to our summary columns, and the row makers, are `foreign_columns`'s; this
module tells the tools apart and reads their files. A file that is none of these, a field of the wrong type
(any JSON value in any field), a file past `MAX_FOREIGN_BYTES` or nested past msgspec's depth is a
`ForeignResultError`: one line naming the file, the field and what was expected.

Each tool's file goes through its typed schema (`foreign_schemas`, derived from the key maps in
`foreign_columns`) in one linear pass: `READERS` maps how a file is recognised (`Sniff`, a first pass that
builds nothing else) to its schema and row maker; a new tool is one more entry. Parsing is pure
(`foreign_rows` takes decoded JSON); `read_foreign` reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kvbench.measure import inference_perf_results, llmd_results
from kvbench.measure.foreign_columns import (
    AIPERF,
    GUIDELLM,
    VLLM,
    VLLM_REQUIRED,
    ForeignResultError,
    aiperf_rows,
    guidellm_rows,
    summary_row,
    vllm_rows,
)
from kvbench.settings import read_yaml

AIPERF_JSON = "profile_export_aiperf.json"
EXPECTED = (
    f"a kvbench run folder, a `vllm bench serve --save-result` JSON, AIPerf's {AIPERF_JSON} (or its "
    "artifact folder), guidellm's benchmarks.json, an llm-d benchmark report (.yaml or .json) or "
    "inference-perf's *_lifecycle_metrics.json"
)
MAX_FOREIGN_BYTES = 256 << 20  # a result file past this is refused before it is read


class Sniff(msgspec.Struct, forbid_unknown_fields=False):
    """What tells the tools apart, read without building the rest of the file."""

    aiperf_version: msgspec.Raw = msgspec.Raw()  # empty: absent
    metadata: msgspec.Raw = msgspec.Raw()
    completed: msgspec.Raw = msgspec.Raw()
    failed: msgspec.Raw = msgspec.Raw()
    request_throughput: msgspec.Raw = msgspec.Raw()
    output_throughput: msgspec.Raw = msgspec.Raw()


@dataclass(frozen=True)
class Reader:
    """One tool's file: whether a sniffed file is one (`claims`), its schema and its rows."""

    name: str
    claims: Callable[[Sniff], bool]
    schema: type
    rows: Callable[[object, str, str], list[dict]]


def is_foreign(path: Path) -> bool:
    """A file (kvbench run folders are folders), or an AIPerf artifact folder."""
    return path.is_file() or (path.is_dir() and (path / AIPERF_JSON).is_file())


def read_foreign(path: Path) -> list[dict]:
    """The summary rows (tenant `all`) of another tool's result file or AIPerf artifact folder."""
    file = path / AIPERF_JSON if path.is_dir() else path
    try:
        size = file.stat().st_size
        if size > MAX_FOREIGN_BYTES:
            raise ForeignResultError(
                f"{file}: {size:,} bytes, more than a result file holds ({MAX_FOREIGN_BYTES:,} "
                f"at most); expected {EXPECTED}"
            )
        if file.suffix in llmd_results.LLMD_SUFFIXES or file.suffix == ".json" and _other_tool(file):
            return [_point_row(point) for point in _other_tool_points(file)]
        raw = file.read_bytes()
    except OSError as exc:
        raise ForeignResultError(f"{file}: cannot read it ({exc.strerror}); expected {EXPECTED}") from None
    except RecursionError:
        raise ForeignResultError(f"{file}: nested deeper than any result file; expected {EXPECTED}") from None
    name, where = (path.name if path.is_dir() else file.stem), str(file)
    sniff = _decoded(lambda: msgspec.json.decode(raw, type=Sniff), where, "not JSON")
    reader = _reader(sniff, where)
    return reader.rows(_decoded(lambda: msgspec.json.decode(raw, type=reader.schema), where), name, where)


def foreign_rows(data, name: str, where: str) -> list[dict]:
    """Summary rows of decoded JSON; `name` labels its rows (run_id), `where` names it in errors."""
    reader = _reader(_raw_sniff(data), where)
    return reader.rows(_decoded(lambda: msgspec.convert(data, reader.schema), where), name, where)


def _raw_sniff(data) -> Sniff | None:
    """The `Sniff` of decoded JSON (None: not an object)."""
    if not isinstance(data, dict):
        return None
    present = {key: msgspec.Raw(b"1") for key in Sniff.__struct_fields__ if key in data}
    metadata = data.get("metadata")
    present["metadata"] = msgspec.Raw(
        b'{"guidellm_version"}' if isinstance(metadata, dict) and "guidellm_version" in metadata else b""
    )
    return Sniff(**present)


def _reader(sniff: Sniff | None, where: str) -> Reader:
    for reader in READERS if sniff is not None else ():
        if reader.claims(sniff):
            return reader
    raise ForeignResultError(f"{where}: not a result file kvbench reads; expected {EXPECTED}")


def _other_tool(file: Path) -> bool:
    """An inference-perf lifecycle file or an llm-d report in JSON (told apart by their top-level keys)."""
    try:
        data = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return llmd_results.is_report(data) or inference_perf_results.is_lifecycle(data)


def _other_tool_points(file: Path) -> list:
    """The points of an llm-d benchmark report (YAML or JSON) or of inference-perf's lifecycle metrics."""
    data = read_yaml(file, "result file")  # JSON is YAML
    if llmd_results.is_report(data):
        return llmd_results.report_points(data, file.stem, str(file))
    if inference_perf_results.is_lifecycle(data):
        config = file.parent / inference_perf_results.CONFIG_YAML
        settings = read_yaml(config, "inference-perf config") if config.is_file() else None
        return inference_perf_results.lifecycle_points(
            data, file.stem, str(file), settings if isinstance(settings, dict) else None
        )
    raise ForeignResultError(f"{file}: not a result file kvbench reads; expected {EXPECTED}")


def _point_row(point) -> dict:
    return summary_row(
        point.tool,
        point.values,
        engine=point.engine,
        workload=point.workload,
        load=point.load,
        requests=point.requests,
        errors=point.errors,
        run_id=point.run_id,
    )


_PATH = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def _decoded(decode: Callable[[], object], where: str, what: str | None = None):
    """`decode()`, or ForeignResultError naming the field msgspec names (`$.a.b[0]` as a.b[0])."""
    try:
        return decode()
    except msgspec.ValidationError as exc:
        match = _PATH.match(str(exc))
        path = (match["path"] or "$").lstrip(".") or "the file"
        raise ForeignResultError(f"{where}: {path}: {match['what'][:120].lower()}") from None
    except msgspec.DecodeError as exc:
        raise ForeignResultError(f"{where}: {what or 'not JSON'} ({str(exc)[:100]}); expected {EXPECTED}") from None
    except RecursionError:
        raise ForeignResultError(f"{where}: nested deeper than any result file; expected {EXPECTED}") from None


READERS = (
    Reader("aiperf", lambda sniff: bool(sniff.aiperf_version), AIPERF, aiperf_rows),
    Reader("guidellm", lambda sniff: b'"guidellm_version"' in bytes(sniff.metadata), GUIDELLM, guidellm_rows),
    Reader("vllm bench", lambda sniff: any(getattr(sniff, key) for key in VLLM_REQUIRED), VLLM, vllm_rows),
)
