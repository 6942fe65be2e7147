"""The tenants-file loader: every bad value is a SettingsError of one line naming the file, the field and
what it accepts (tests/data/bad_inputs/tenants holds one file per kind of defect); good files load whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvbench.engines.kvengine.core.tiers import TierTTL
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.settings.tenants import load_tenants, parse_tenants
from kvbench.settings import SettingsError
from tests.engines.kvengine.runtime.tiers_fixtures import make_engine

BAD = Path(__file__).parents[3] / "data" / "bad_inputs" / "tenants"

# file -> the text its message must contain (the field and what it accepts); the bad-input corpus test of the
# CLI reads the same file
EXPECTED = yaml.safe_load((BAD / "expect.yaml").read_text())


def test_every_bad_file_is_named_in_expect_yaml():
    assert sorted(p.name for p in BAD.iterdir() if p.name != "expect.yaml") == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_bad_tenants_file_is_one_line_naming_the_file_and_the_field(name):
    with pytest.raises(SettingsError) as caught:
        load_tenants(BAD / name)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(BAD / name) + ": ")
    assert EXPECTED[name] in message


def test_an_unreadable_or_huge_file_is_a_settings_error(tmp_path):
    with pytest.raises(SettingsError, match="cannot read"):
        load_tenants(tmp_path / "missing.yaml")
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(SettingsError, match="larger than"):
        load_tenants(huge)


def test_a_good_file_loads_every_field(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "cap_fraction: 0.25\n"
        "shared_prefixes: ['You are helpful.', [1, 2, 3]]\n"
        "tenants:\n"
        "  acme:\n    api_keys: [k-acme-1, k-acme-2]\n    quota_pages: 40\n    reserved_device_pages: 8\n"
        "    device_ttl_s: 5\n"
        "  beta.team-2:\n    api_keys: [k-beta]\n"
    )
    config = load_tenants(path, default_ttl=TierTTL(30, 900))
    assert config.cap_fraction == 0.25
    assert config.shared_prefixes == ("You are helpful.", (1, 2, 3))
    assert [config.tenant_for(k) for k in ("k-acme-2", "k-beta", "k-acme", "")] == ["acme", "beta.team-2", None, None]
    assert config.ttls() == {"acme": TierTTL(5.0, 900.0)}
    ledger = config.ledger(100)
    assert ledger.terms_of("acme").quota_pages == 40 and ledger.terms_of("acme").reserved_device_pages == 8
    assert ledger.terms_of("beta.team-2").quota_pages == 100


def test_json_files_are_read_as_json_and_nan_is_refused(tmp_path):
    path = tmp_path / "tenants.json"
    path.write_text('{"tenants": {"a": {"api_keys": ["k"], "device_ttl_s": NaN}}}')
    with pytest.raises(SettingsError, match="device_ttl_s"):
        load_tenants(path)


def test_reservations_beyond_the_device_tier_name_the_file_when_the_engine_starts(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  a:\n    api_keys: [k]\n    reserved_device_pages: 1000\n")
    with pytest.raises(SettingsError, match=f"{path}: .*reserved device pages exceed"):
        make_engine(tiny_loaded_model(), kv_capacity=256, tenants_file=str(path))


def test_parse_tenants_refuses_a_huge_ttl_and_a_fractional_quota():
    with pytest.raises(SettingsError, match=r"host_ttl_s: expected a number of seconds in \[0, 1e\+09\]"):
        parse_tenants({"tenants": {"a": {"api_keys": ["k"], "host_ttl_s": 10**400}}})
    with pytest.raises(SettingsError, match="quota_pages: expected a whole number"):
        parse_tenants({"tenants": {"a": {"api_keys": ["k"], "quota_pages": 2.5}}})
