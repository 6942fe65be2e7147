"""The simulator's commands end to end: `kvbench run --engine sim` and `kvbench simulate` write run folders."""

import json

import yaml

from kvbench.cli.main import main


def test_run_with_the_sim_engine_writes_a_run_folder(tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--engine",
                "sim",
                "--sim-preset",
                "kvengine-tiers",
                "--sim-model",
                "qwen2.5-72b",
                "--sim-hardware",
                "8xh200",
                "--workload",
                "rag-chat-mini",
                "--num-sessions",
                "6",
                "--concurrency",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    entry = json.loads((out / "summary.json").read_text())["runs"][0]
    assert entry["engine"] == "sim:kvengine-tiers/fp8"
    assert entry["summary"]["overall"]["completed"] == len((out / "requests.jsonl").read_text().splitlines()) > 6


def test_two_kv_dtypes_of_one_preset_are_two_entries_with_their_own_records(tmp_path):
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "rag-chat-mini",
                "--num-sessions",
                "4",
                "--preset",
                "vllm-prefix",
                "--kv-dtype",
                "fp8",
                "--kv-dtype",
                "fp16",
                "--concurrency",
                "2",
                "--out",
                str(out),
                "--no-plots",
            ]
        )
        == 0
    )
    entries = json.loads((out / "summary.json").read_text())["runs"]
    assert [e["engine"] for e in entries] == ["sim:vllm-prefix/fp8", "sim:vllm-prefix/fp16"]
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    for entry in entries:
        mine = [r for r in records if r["run_id"] == entry["run_id"]]
        assert entry["summary"]["overall"]["requests"] == len(mine) > 0


def test_simulate_takes_a_tenants_file(tmp_path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(yaml.safe_dump({"tenants": {"tenant-b": {"api_keys": ["kb"], "reserved_device_pages": 100}}}))
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "rag-chat-mt-mini",
                "--preset",
                "vllm-prefix",
                "--device-kv-tokens",
                "4000",
                "--tenants-file",
                str(tenants),
                "--rate",
                "2",
                "--out",
                str(out),
                "--no-plots",
            ]
        )
        == 0
    )
    assert yaml.safe_load((out / "config.yaml").read_text())["simulate"]["tenants_file"] == str(tenants)
    tenants.write_text("tenants: {}\n")
    assert (
        main(
            [
                "simulate",
                "--workload",
                "rag-chat-mt-mini",
                "--tenants-file",
                str(tenants),
                "--out",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
