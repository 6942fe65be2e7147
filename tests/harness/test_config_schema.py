"""config.yaml's schema version: a baseline written before keys gained defaults compares equal to today's run of
the same config; a real difference, in either direction, is still a mismatch (and `compare --strict` exits 1)."""

from pathlib import Path

import pytest
import yaml

from kvbench.harness import config_schema
from kvbench.harness.config import SCHEMA_VERSION, load_config_file, parse_config
from kvbench.measure.run_folder import read_run_folder
from kvbench.verdicts.compare import compare
from tests.verdicts.test_compare import entry, make_records, write_run

ROOT = Path(__file__).resolve().parents[2]
# The committed CPU nightly baseline: written on 2026-11-30 by schema version 1 (no schema_version key, no
# header/first-byte timeouts, max_error_rate or workers, isolation `shared` written out).
BASELINE_CONFIG = yaml.safe_load((ROOT / "results/baselines/nightly-cpu/config.yaml").read_text())


def today(**client) -> dict:
    config = load_config_file(ROOT / "ci/nightly-cpu.yaml").to_dict()
    config["client"].update(client)
    return config


def folders(tmp_path, base_config, new_config):
    records = make_records(1, noise=0.05)  # a quiet machine's runs: the metrics resolve, so only config decides
    base = write_run(tmp_path / "base", [(entry(records), records)], config=base_config)
    new = write_run(tmp_path / "new", [(entry(records), records)], config=new_config)
    return compare(read_run_folder(base), read_run_folder(new))


def test_the_committed_v1_baseline_reads_as_todays_config_of_the_nightly():
    assert "schema_version" not in BASELINE_CONFIG and "header_timeout_s" not in BASELINE_CONFIG["client"]
    read = config_schema.current(BASELINE_CONFIG)
    assert read.version == 1 and read.config["schema_version"] == SCHEMA_VERSION == today()["schema_version"]
    assert set(read.filled) == {
        "client.header_timeout_s",
        "client.first_byte_timeout_s",
        "client.max_error_rate",
        "client.workers",
    }
    assert read.config["client"]["isolation"] is None  # version 1's default, written out as `shared`
    for section in ("seed", "repeat", "stop", "client", "slo"):
        assert read.config[section] == today()[section], section


def test_a_baseline_with_only_defaulted_keys_compares_equal_and_says_what_was_filled(tmp_path):
    comparison = folders(tmp_path, BASELINE_CONFIG, today())
    assert comparison.mismatches == () and comparison.exit_code(strict=True) == 0
    assert any("schema version 1" in note and "client.max_error_rate" in note for note in comparison.notes)


@pytest.mark.parametrize(
    "client", [{"max_error_rate": 0.5}, {"workers": 2}, {"isolation": "strict"}, {"request_timeout_s": 30.0}]
)
def test_a_real_difference_is_still_refused(tmp_path, client):
    comparison = folders(tmp_path, BASELINE_CONFIG, today(**client))
    (key,) = client
    assert [text for text in comparison.mismatches if f"client.{key}" in text], comparison.mismatches
    assert comparison.exit_code(strict=True) == 1


def test_a_v1_key_set_away_from_todays_default_is_a_difference(tmp_path):
    # A version-1 folder that ran with a 30 s stall timeout keeps it: only absent keys are filled.
    old = {**BASELINE_CONFIG, "client": {**BASELINE_CONFIG["client"], "stall_timeout_s": 30.0}}
    comparison = folders(tmp_path, old, today())
    assert comparison.mismatches == ("config.yaml differs: client.stall_timeout_s: 30.0 -> 120.0",)


def test_an_unknown_schema_version_is_one_named_mismatch_and_a_config_error(tmp_path):
    comparison = folders(tmp_path, {**BASELINE_CONFIG, "schema_version": SCHEMA_VERSION + 1}, today())
    assert len(comparison.mismatches) == 1 and "schema_version" in comparison.mismatches[0]
    with pytest.raises(ValueError, match="schema_version"):
        parse_config({"engines": ["kvengine"], "schema_version": "two"})
    assert parse_config({"engines": ["kvengine"], "schema_version": 1}).to_dict()["schema_version"] == SCHEMA_VERSION


def test_a_kvengine_entry_before_version_3_keeps_the_prefill_rule_it_ran_with():
    # Before max_prefill_beside_decodes existed, prefill beside decodes was bounded by the step budget alone.
    assert config_schema.kvengine_settings_as_run({"max_step_tokens": 96}, 2)["max_prefill_beside_decodes"] == 96
    assert config_schema.kvengine_settings_as_run({}, 1)["max_prefill_beside_decodes"] == 512
    # Version 3's default was 32, versions 4-5's 128 (today's is auto); from version 6 a missing key is today's.
    assert config_schema.kvengine_settings_as_run({}, 3)["max_prefill_beside_decodes"] == 32
    assert (
        config_schema.kvengine_settings_as_run({"max_prefill_beside_decodes": 7}, 3)["max_prefill_beside_decodes"] == 7
    )
    assert config_schema.kvengine_settings_as_run({}, 4)["max_prefill_beside_decodes"] == 128
    assert config_schema.kvengine_settings_as_run({}, 5)["max_prefill_beside_decodes"] == 128
    assert (
        config_schema.kvengine_settings_as_run({"max_prefill_beside_decodes": "auto"}, 5)["max_prefill_beside_decodes"]
        == "auto"
    )
    assert "max_prefill_beside_decodes" not in config_schema.kvengine_settings_as_run({}, 6)
    read5 = config_schema.current({**BASELINE_CONFIG, "schema_version": 5})
    assert read5.config["engines"][0]["settings"]["max_prefill_beside_decodes"] == 128
    read3 = config_schema.current({**BASELINE_CONFIG, "schema_version": 3})
    assert read3.config["engines"][0]["settings"]["max_prefill_beside_decodes"] == 32
    read = config_schema.current({**BASELINE_CONFIG})
    assert read.config["engines"][0]["settings"]["max_prefill_beside_decodes"] == 512


def test_a_version_4_config_keeps_its_load_points_and_a_staged_load_point_expands_per_stage():
    version4 = {**BASELINE_CONFIG, "schema_version": 4}
    read = config_schema.current(version4)
    assert read.config["loads"] == BASELINE_CONFIG.get("loads") and read.config["schema_version"] == SCHEMA_VERSION == 6
    config = parse_config(
        {"engines": ["endpoint"], "loads": [{"stages": "3:20, 10:2", "warmup_stage": "15:5"}, {"concurrency": 2}]}
    )
    assert [load.label for load in config.load_specs()] == ["3/s x 20 s", "10/s x 2 s", "conc=2"]
    assert [load.rate for load in config.load_specs()[:2]] == [3, 10]
    for bad, says in (
        ({"stages": "3:20", "request_rate": 2}, "leave out request_rate"),
        ({"warmup_stage": "3:20"}, "needs stages"),
        ({"stages": "3"}, "RATE:SECONDS"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_config({"engines": ["endpoint"], "loads": [bad]})
    with pytest.raises(ValueError, match="client.workers"):
        parse_config({"engines": ["endpoint"], "loads": [{"stages": "3:20"}], "client": {"workers": 2}})
