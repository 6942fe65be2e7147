"""Result files of other benchmarks read into rows of kvbench's summary table, so `kvbench report` puts them
beside our run folders: `vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py's `result_json`; our
`vllm/<point>.json` files too).

One door: `vllm_result_row` is the only place that reads such a file's values; a missing or mistyped field is
a `ForeignResultError` naming it. What vLLM does not measure (cache hit rates, the oracle) is missing, not 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvbench.settings import SettingsError

# Our summary column -> vLLM's key (times in ms, throughputs per second, as vLLM writes them).
_VLLM_COLUMNS = {
    "ttft_p50_ms": "median_ttft_ms", "ttft_p90_ms": "p90_ttft_ms", "ttft_p99_ms": "p99_ttft_ms",
    "itl_p50_ms": "median_itl_ms", "itl_p99_ms": "p99_itl_ms", "tpot_p50_ms": "median_tpot_ms",
    "e2e_p50_ms": "median_e2el_ms", "e2e_p99_ms": "p99_e2el_ms", "output_tok_s": "output_throughput",
    "total_tok_s": "total_token_throughput", "req_s": "request_throughput", "goodput_req_s": "request_goodput",
}
_REQUIRED = ("completed", "failed", "request_throughput", "output_throughput")


class ForeignResultError(SettingsError):
    """A result file that is not what it claims (bad input: the CLI exits 2)."""


def is_vllm_result(path: Path) -> bool:
    return path.is_file() and path.suffix == ".json"


def vllm_result_row(path: Path) -> dict:
    """One summary row (tenant `all`) of a vLLM bench result file."""
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ForeignResultError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or any(key not in data for key in _REQUIRED):
        missing = [key for key in _REQUIRED if not isinstance(data, dict) or key not in data]
        raise ForeignResultError(f"{path}: not a vllm bench serve result: no {', '.join(missing)}")
    row = {column: _number(data, key, path) for column, key in _VLLM_COLUMNS.items()}
    completed, failed = _count(data, "completed", path), _count(data, "failed", path)
    rate, cap = data.get("request_rate"), data.get("max_concurrency")
    load = f"rps={rate}" if rate not in (None, "inf") else "rps=inf"
    return {
        **row, "engine": str(data.get("label") or data.get("backend") or "vllm bench"), "kv_dtype": "unknown",
        "workload": str(data.get("dataset_name") or data.get("model_id") or path.stem),
        "load": load + (f",max={cap}" if cap is not None else ""), "tenant": "all",
        "requests": completed + failed, "errors": failed, "cache_hit_rate": None, "oracle_hit_rate": None,
        "prefill_recompute_rate": None, "run_id": path.stem, "repeat": 0, "valid": failed == 0,
        "invalid_reasons": None,
    }


def _number(data: dict, key: str, path: Path) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ForeignResultError(f"{path}: {key} is {value!r:.40}, not a number")
    return float(value)


def _count(data: dict, key: str, path: Path) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ForeignResultError(f"{path}: {key} is {value!r:.40}, not a count")
    return value
