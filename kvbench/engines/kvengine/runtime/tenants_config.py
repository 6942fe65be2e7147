"""Tenants from a config file (YAML or JSON): API keys, quotas, premium reservations and tier TTLs.

    cap_fraction: 0.5            # most of the device tier one tenant holds under contention
    tenants:
      acme:
        api_keys: [sk-acme-1, sk-acme-2]
        quota_pages: 512         # device pages beyond this are evicted first (default: the whole tier)
        reserved_device_pages: 64  # > 0: a premium tenant, whose pages others cannot take below this
        device_ttl_s: 30         # idle time before its pages leave device (default 30), then host (600)
        host_ttl_s: 600

A key names exactly one tenant. The file decides identity; a request cannot name its own tenant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.engines.kvengine.core.prefix_index import TenantId
from kvbench.engines.kvengine.core.tenants import TenantLedger, TenantTerms
from kvbench.engines.kvengine.core.tiers import TierTTL

_TENANT_KEYS = {"api_keys", "quota_pages", "reserved_device_pages", "device_ttl_s", "host_ttl_s"}


@dataclass(frozen=True)
class TenantSpec:
    tenant: TenantId
    api_keys: tuple[str, ...]
    quota_pages: int | None = None
    reserved_device_pages: int = 0
    ttl: TierTTL | None = None


@dataclass(frozen=True)
class TenantsConfig:
    tenants: tuple[TenantSpec, ...] = ()
    cap_fraction: float = 0.5
    _by_key: Mapping[str, TenantId] = field(default_factory=dict, repr=False)

    def tenant_for(self, api_key: str) -> TenantId | None:
        """The tenant an API key belongs to; None for an unknown key."""
        return self._by_key.get(api_key)

    def ledger(self, device_pages: int) -> TenantLedger:
        terms = {
            s.tenant: TenantTerms(device_pages if s.quota_pages is None else s.quota_pages, s.reserved_device_pages)
            for s in self.tenants
        }
        return TenantLedger(device_pages, terms, self.cap_fraction)

    def ttls(self, default: TierTTL) -> dict[TenantId, TierTTL]:
        return {s.tenant: s.ttl for s in self.tenants if s.ttl is not None}

    def quota_pages(self, device_pages: int) -> dict[TenantId, int]:
        return {s.tenant: device_pages if s.quota_pages is None else s.quota_pages for s in self.tenants}


def load_tenants(path: str | Path, default_ttl: TierTTL = TierTTL()) -> TenantsConfig:
    """Read and check a tenants file; errors name the file, the field and the fix."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"tenants_file: cannot read {path}: {exc.strerror}") from None
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    return parse_tenants(data or {}, str(path), default_ttl)


def parse_tenants(data: Mapping, where: str = "tenants", default_ttl: TierTTL = TierTTL()) -> TenantsConfig:
    if not isinstance(data, Mapping) or not isinstance(data.get("tenants"), Mapping) or not data["tenants"]:
        raise ValueError(f"{where}: expected a mapping with a non-empty 'tenants' mapping of name -> terms")
    unknown = set(data) - {"tenants", "cap_fraction"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; valid: tenants, cap_fraction")
    specs, by_key = [], {}
    for name, terms in data["tenants"].items():
        at = f"{where}: tenants.{name}"
        if not isinstance(terms, Mapping):
            raise ValueError(f"{at}: expected a mapping of {sorted(_TENANT_KEYS)}")
        if set(terms) - _TENANT_KEYS:
            raise ValueError(f"{at}: unknown keys {sorted(set(terms) - _TENANT_KEYS)}; valid: {sorted(_TENANT_KEYS)}")
        keys = terms.get("api_keys")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"{at}.api_keys: give a non-empty list of key strings")
        for key in keys:
            if key in by_key:
                raise ValueError(f"{at}.api_keys: key {key[:4]}... already belongs to tenant {by_key[key]!r}")
            by_key[key] = TenantId(str(name))
        ttl = None
        if "device_ttl_s" in terms or "host_ttl_s" in terms:
            ttl = TierTTL(float(terms.get("device_ttl_s", default_ttl.device_s)),
                          float(terms.get("host_ttl_s", default_ttl.host_s)))
        specs.append(TenantSpec(TenantId(str(name)), tuple(keys), terms.get("quota_pages"),
                                int(terms.get("reserved_device_pages", 0)), ttl))
    return TenantsConfig(tuple(specs), float(data.get("cap_fraction", 0.5)), by_key)
