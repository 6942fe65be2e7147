"""`vllm bench serve`'s dataset, server and result flags, as `kvbench run` takes them, so that a command line
copied from vLLM's docs runs with `vllm bench serve` replaced by `kvbench run` (its load and percentile flags:
cli/vllm_flags.py).

- Dataset: `--dataset-name random|prefix_repetition|sharegpt|hf|custom` with `--dataset-path` is kvbench's
  workload `random`, `prefix_repetition`, `sharegpt:PATH` or `dataset:PATH`; `--random-input-len`,
  `--random-output-len`, `--random-range-ratio`, `--random-prefix-len`, `--prefix-repetition-*`,
  `--sharegpt-output-len` and `--input-len`/`--output-len` are that workload's options. Without a load flag such a
  run sends every request as soon as it is ready (vLLM's default `--request-rate inf`).
- Server: `--base-url`, `--host`/`--port`, `--backend` and `--endpoint` name a running server (vLLM's default
  http://127.0.0.1:8000) that kvbench measures as `--url`; `--backend openai-chat` or `--endpoint
  /v1/chat/completions` is `--api chat`; `--served-model-name` is the model name sent.
- Result: kvbench writes every point's vLLM result JSON in the run folder (`vllm/<point>.json`); `--save-result`
  (or `--append-result`) also writes it where vLLM would (`--result-dir`, `--result-filename`, else vLLM's
  `{label}-{request_rate}qps[-concurrency{C}]-{model}-{date}.json`), with `--label` and `--metadata KEY=VALUE`;
  `--save-detailed` adds the per-request lists (input_lens, output_lens, start_times, ttfts, itls, errors).
- `--temperature` and `--top-p` are accepted at kvbench's own sampling (greedy: 0 and 1). The rest of vLLM's
  flags that kvbench cannot honour are refused with what to use instead (REFUSED).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from kvbench.settings import SettingsError

VLLM_DEFAULT_URL = "http://127.0.0.1:8000"
# vLLM's dataset names -> kvbench's workload name (a prefix where --dataset-path follows).
DATASETS = {
    "random": "random",
    "prefix_repetition": "prefix_repetition",
    "sharegpt": "sharegpt:",
    "hf": "dataset:",
    "custom": "dataset:",
}
BACKENDS = {"vllm": "completions", "openai": "completions", "openai-chat": "chat"}
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
# A dataset flag -> (the datasets it applies to, the workload option it sets).
DATASET_OPTIONS = {
    "random_input_len": (("random",), "input_len"),
    "random_output_len": (("random",), "output_len"),
    "random_range_ratio": (("random",), "range_ratio"),
    "random_prefix_len": (("random",), "prefix_len"),
    "prefix_repetition_prefix_len": (("prefix_repetition",), "prefix_len"),
    "prefix_repetition_suffix_len": (("prefix_repetition",), "suffix_len"),
    "prefix_repetition_num_prefixes": (("prefix_repetition",), "num_prefixes"),
    "prefix_repetition_output_len": (("prefix_repetition",), "output_len"),
    "sharegpt_output_len": (("sharegpt",), "output_len"),
    "input_len": (("random",), "input_len"),
    "output_len": (("random", "prefix_repetition", "sharegpt", "hf", "custom"), "output_len"),
    "hf_output_len": (("hf",), "output_len"),
    "custom_output_len": (("custom",), "output_len"),
    "hf_split": (("hf",), "split"),
}
_OPTION_TYPES = {"range_ratio": float, "split": str}  # the others are token counts
# kvbench's own sampling: greedy, so that runs repeat; vLLM's sampling flags are accepted at these values.
SAMPLING = {"temperature": 0.0, "top_p": 1.0}
DETAILED = {
    "input_lens": "prompt_tokens",
    "output_lens": "output_tokens",
    "start_times": "sent_at",
    "ttfts": "ttft_ms",
    "itls": "itl_ms",
    "errors": "error",
}

_INSTEAD_ENGINE = "set it on the server you measure"
_OTHER_DATASET = (
    "an option of a dataset kvbench does not read; use --dataset-name random, prefix_repetition, "
    "sharegpt or hf/custom (a local file: --dataset-path), or --workload (a trace: its path)"
)
REFUSED = {
    "--num-warmups": "kvbench's warm-up requests are measured and left out: use --warmup N",
    "--ramp-up-strategy": "use --stages R:S,... (a Poisson ladder) or --find-max request-rate",
    "--ramp-up-start-rps": "use --stages R:S,...",
    "--ramp-up-end-rps": "use --stages R:S,...",
    "--profile": "kvbench does not drive vLLM's profiler; profile the server itself",
    "--use-beam-search": "kvbench measures sampled streams only",
    "--logprobs": "kvbench asks for no logprobs",
    "--lora-modules": _INSTEAD_ENGINE,
    "--lora-assignment": _INSTEAD_ENGINE,
    "--top-k": "kvbench samples greedily (temperature 0)",
    "--min-p": "kvbench samples greedily (temperature 0)",
    "--frequency-penalty": "kvbench samples greedily",
    "--presence-penalty": "kvbench samples greedily",
    "--repetition-penalty": "kvbench samples greedily",
    "--header": "give --api-key for a Bearer token; other headers are not sent",
    "--extra-body": "kvbench sends its own request body",
    "--chat-template-kwargs": "kvbench sends its own request body",
    "--request-id-prefix": "kvbench names requests itself (requests.jsonl)",
    "--self-timed": "use --trace-times to replay a trace's own times",
    "--probe-request-rate": "use --find-max request-rate",
    "--tokenizer-mode": "give --tokenizer DIR (a local Hugging Face tokenizer folder)",
    "--skip-tokenizer-init": "give --tokenizer DIR or none",
    "--insecure": "use an http:// --url or a trusted https one",
    "--ready-check-timeout-sec": "kvbench waits for the server itself (client.health_timeout_s in CONFIG.yaml)",
    "--plot-timeline": "kvbench writes its plots in the run folder (kvbench report RUN_DIR --format html)",
    "--plot-dataset-stats": "see the workload with kvbench workload NAME --stats",
    "--timeline-itl-thresholds": "kvbench report RUN_DIR --format html has the ITL plots",
    "--no-self-timed": "arrivals follow the load flags unless --trace-times is given",
    "--enable-multimodal-chat": "kvbench sends text prompts only",
    "--random-batch-size": "kvbench measures generation, not embeddings or rerank batches",
    "--no-reranker": "kvbench measures generation, not rerank",
    **{
        flag: _OTHER_DATASET
        for flag in (
            "--asr-max-audio-len-sec",
            "--asr-min-audio-len-sec",
            "--bfcl-categories",
            "--blazedit-max-distance",
            "--blazedit-min-distance",
            "--custom-ensure-client-side-data",
            "--hf-name",
            "--hf-subset",
            "--random-mm-base-items-per-request",
            "--random-mm-bucket-config",
            "--random-mm-limit-mm-per-prompt",
            "--random-mm-num-mm-items-range-ratio",
            "--spec-bench-category",
            "--spec-bench-output-len",
            "--speed-bench-category",
            "--speed-bench-dataset-subset",
            "--speed-bench-output-len",
            "--timed-trace-chunk-hash-size",
            "--timed-trace-label-hash-ids",
            "--timed-trace-label-input-length",
            "--timed-trace-label-output-length",
            "--timed-trace-label-timestamp",
            "--timed-trace-sec-multiplier",
        )
    },
}


class Refused(argparse.Action):
    """A vLLM flag kvbench cannot honour: the parse stops with one line saying what to use instead."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="*", default=None, help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} (vllm bench serve's) is not supported by kvbench run: {REFUSED[self.option_strings[0]]}"
        )


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "vllm bench serve's flags (with their meanings in vLLM; see kvbench/cli/vllm_bench_flags.py)"
    )
    group.add_argument(
        "--dataset-name",
        choices=tuple(DATASETS),
        help="vLLM's dataset: random and prefix_repetition "
        "are generated, sharegpt/hf/custom read --dataset-path (kvbench's --workload)",
    )
    group.add_argument("--dataset-path", help="the sharegpt JSON(L) or dataset file or folder")
    for name, (datasets, option) in DATASET_OPTIONS.items():
        kind = _OPTION_TYPES.get(option, int)
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            metavar={int: "N", float: "R", str: "NAME"}[kind],
            help=f"workload option {option} of --dataset-name {'/'.join(datasets)}",
        )
    group.add_argument("--base-url", help="a running server's base URL (kvbench's --url)")
    group.add_argument("--host", help=f"a running server's host (with --port; default of {VLLM_DEFAULT_URL})")
    group.add_argument("--port", type=int, help="a running server's port")
    group.add_argument(
        "--backend",
        choices=tuple(BACKENDS),
        help="a running server's API: vllm/openai are "
        f"completions, openai-chat is chat (default URL {VLLM_DEFAULT_URL})",
    )
    group.add_argument("--endpoint", choices=tuple(ENDPOINTS), help="the API path (kvbench's --api)")
    group.add_argument("--served-model-name", help="the model name sent in requests (default --model)")
    for name, value in SAMPLING.items():
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=float,
            help=f"accepted at {value:g}: kvbench samples greedily, so that runs repeat",
        )
    group.add_argument("--save-result", action="store_true", help="also write the vLLM result JSON where vLLM would")
    group.add_argument("--append-result", action="store_true", help="append it to that file (one JSON a line)")
    group.add_argument("--save-detailed", action="store_true", help="with the per-request lists")
    group.add_argument("--result-dir", type=Path, help="folder of that file (default: the current one)")
    group.add_argument("--result-filename", help="its name (default: vLLM's)")
    group.add_argument("--label", help="the result's label (default: --backend)")
    group.add_argument("--metadata", nargs="*", default=[], metavar="KEY=VALUE", help="keys added to the result")
    for flag in (
        "--disable-tqdm",
        "--trust-remote-code",
        "--no-stream",
        "--disable-shuffle",
        "--no-oversample",
        "--skip-chat-template",
    ):
        group.add_argument(flag, action="store_true", help="accepted; no effect in kvbench")
    for flag in REFUSED:
        group.add_argument(flag, action=Refused)


def check(args: argparse.Namespace) -> None:
    """Refuse what the flags cannot mean together, each in one line naming the flag."""
    for name, value in SAMPLING.items():
        given = getattr(args, name)
        if given is not None and given != value:
            raise SettingsError(
                f"--{name.replace('_', '-')} {given:g}: kvbench samples greedily so that runs repeat "
                f"(temperature 0, top-p 1); leave it out or give {value:g}"
            )
    for item in args.metadata:
        if "=" not in item:
            raise SettingsError(f"--metadata {item!r}: expected KEY=VALUE, e.g. --metadata version=0.3.3 tp=1")
    dataset = args.dataset_name
    if dataset is not None and args.workload:
        raise SettingsError("--dataset-name and --workload both name the workload: give one of them")
    for name, (datasets, _) in DATASET_OPTIONS.items():
        if getattr(args, name) is not None and (dataset or "random") not in datasets:
            raise SettingsError(
                f"--{name.replace('_', '-')}: applies to --dataset-name {'/'.join(datasets)}, not {dataset or 'random'}"
            )
    if dataset is not None and DATASETS[dataset].endswith(":") and not args.dataset_path:
        raise SettingsError(f"--dataset-name {dataset}: give --dataset-path FILE")


def workload(args: argparse.Namespace) -> dict | None:
    """The workload entry vLLM's dataset flags name, or None when they name none."""
    options = {
        option: getattr(args, name) for name, (_, option) in DATASET_OPTIONS.items() if getattr(args, name) is not None
    }
    if args.dataset_name is None and not options:
        return None
    kind = DATASETS[args.dataset_name or "random"]
    entry: dict = {"name": kind + (args.dataset_path or "") if kind.endswith(":") else kind}
    if options:
        entry["overrides"] = options
    return entry


def server(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the running server's URL, its API) that vLLM's server flags name; (None, None) when they name none."""
    api = ENDPOINTS.get(args.endpoint) or BACKENDS.get(args.backend)
    if args.base_url:
        return args.base_url, api
    if args.host or args.port or args.backend or args.endpoint:
        return f"http://{args.host or '127.0.0.1'}:{args.port or 8000}", api
    return None, api


def save_results(args: argparse.Namespace, run_dir: Path, run_ids: Sequence[str]) -> list[Path]:
    """vLLM's --save-result file of each point (`run_ids`): its vllm/<point>.json in the run folder, with the
    label, the metadata and (--save-detailed) the lists from its measured rows of requests_metrics.jsonl;
    returns the files written."""
    from kvbench.measure.run_folder import REQUESTS_METRICS_JSONL, VLLM_RESULTS_DIR, engine_dir

    if not (args.save_result or args.append_result):
        return []
    rows: dict[str, list[dict]] = {}
    if args.save_detailed:
        for line in (run_dir / REQUESTS_METRICS_JSONL).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if not row["warmup"]:
                rows.setdefault(row["run_id"], []).append(row)
    written = []
    for index, run_id in enumerate(run_ids):
        path = run_dir / VLLM_RESULTS_DIR / (engine_dir(Path(), run_id).name + ".json")
        saved = json.loads(path.read_text(encoding="utf-8"))
        result = {**saved, "label": args.label or args.backend or saved.get("backend")}
        result.update(dict(item.split("=", 1) for item in args.metadata))
        if args.save_detailed:
            result.update(_detailed(rows.get(run_id, [])))
        path = _result_path(args, result, index if len(run_ids) > 1 else None)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+" if args.append_result else "w", encoding="utf-8") as out:
            if args.append_result and out.tell() != 0:
                out.write("\n")
            json.dump(result, out, default=str)
        written.append(path)
    return written


def _detailed(rows: Sequence[dict]) -> dict:
    """vLLM's per-request lists from kvbench's request rows: seconds where vLLM has seconds, "" for no error."""
    seconds = {"ttfts", "itls"}
    lists: dict[str, list] = {}
    for key, column in DETAILED.items():
        values = [row[column] for row in rows]
        if key in seconds:
            values = [
                [v / 1e3 for v in value] if isinstance(value, list) else None if value is None else value / 1e3
                for value in values
            ]
        lists[key] = ["" if key == "errors" and value is None else value for value in values]
    return lists


def _result_path(args: argparse.Namespace, result: dict, index: int | None) -> Path:
    """vLLM's file name (compute_result_filename), `-<n>` before `.json` when the run has several points."""
    if args.result_filename:
        name = args.result_filename
    else:
        rate = result["request_rate"]
        rate_text = "inf" if rate == "inf" or (isinstance(rate, float) and math.isinf(rate)) else rate
        concurrency = f"-concurrency{result['max_concurrency']}" if result.get("max_concurrency") else ""
        model = str(result.get("model_id") or "model").split("/")[-1]
        name = f"{result['label']}-{rate_text}qps{concurrency}-{model}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if index is not None:
        stem, dot, suffix = name.rpartition(".")
        name = f"{stem}-{index}.{suffix}" if dot else f"{name}-{index}"
    return (args.result_dir or Path()) / name
