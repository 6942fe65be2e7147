"""Tenants from a config file (YAML or JSON): API keys, quotas, premium reservations, tier TTLs, and the
prefixes every tenant may share.

    cap_fraction: 0.5            # most of the device tier one tenant holds under contention, in (0, 1]
    shared_prefixes:             # in shared-prefix isolation, only these are shared across tenants
      - "You are a helpful assistant."   # text (tokenised by the served model; a chat system message too)
      - [1, 2, 3, 4]                     # or token ids
    tenants:
      acme:
        api_keys: [sk-acme-1, sk-acme-2]
        quota_pages: 512         # device pages beyond this are evicted first (default: the whole tier)
        reserved_device_pages: 64  # > 0: a premium tenant, whose pages others cannot take below this
        device_ttl_s: 30         # idle time before its pages leave device (default 30), then host (600)
        host_ttl_s: 600

A key names exactly one tenant. The file decides identity; a request cannot name its own tenant. Every value
is checked: a bad file raises SettingsError with one line naming the file, the field and what it accepts.
"""

from __future__ import annotations

import hmac
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.engines.kvengine.core.namespaces import TenantId
from kvbench.engines.kvengine.core.tenants import TenantLedger, TenantTerms
from kvbench.engines.kvengine.core.tiers import TierTTL
from kvbench.settings import SettingsError

_TOP_KEYS = ("tenants", "cap_fraction", "shared_prefixes")
_TENANT_KEYS = ("api_keys", "quota_pages", "reserved_device_pages", "device_ttl_s", "host_ttl_s")
MAX_FILE_BYTES = 1 << 20
MAX_TTL_S = 1e9  # about 30 years: a TTL beyond it is a typo  # a tenants file is a few lines per tenant; more is not a tenants file
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # becomes a Prometheus label and a namespace
_KEY = re.compile(r"[\x21-\x7e]{1,256}")  # what a Bearer header can carry: printable ASCII, no spaces

SharedPrefix = str | tuple[int, ...]


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
    shared_prefixes: tuple[SharedPrefix, ...] = ()  # text or token ids; see the module docstring
    _by_key: Mapping[str, TenantId] = field(default_factory=dict, repr=False)

    def tenant_for(self, api_key: str) -> TenantId | None:
        """The tenant an API key belongs to; None for an unknown key. Every key is compared, in constant
        time, so the answer's timing tells nothing about the keys."""
        given = api_key.encode("utf-8", "surrogateescape")
        found = None
        for key, tenant in self._by_key.items():
            if hmac.compare_digest(key.encode(), given):
                found = tenant
        return found

    def ledger(self, device_pages: int) -> TenantLedger:
        terms = {
            s.tenant: TenantTerms(device_pages if s.quota_pages is None else s.quota_pages, s.reserved_device_pages)
            for s in self.tenants
        }
        return TenantLedger(device_pages, terms, self.cap_fraction)

    def ttls(self) -> dict[TenantId, TierTTL]:
        """The TTLs the file sets, by tenant; a tenant without one follows the engine's."""
        return {s.tenant: s.ttl for s in self.tenants if s.ttl is not None}

    def quota_pages(self, device_pages: int) -> dict[TenantId, int]:
        return {s.tenant: device_pages if s.quota_pages is None else s.quota_pages for s in self.tenants}


def load_tenants(path: str | Path, default_ttl: TierTTL = TierTTL()) -> TenantsConfig:
    """Read and check a tenants file (JSON when it ends in .json, YAML otherwise). Raises SettingsError."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SettingsError(f"tenants_file: cannot read {path}: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SettingsError(f"{path}: larger than {MAX_FILE_BYTES} bytes; a tenants file is a few lines per tenant")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SettingsError(f"{path}: not UTF-8 text; a tenants file is YAML or JSON") from None
    data = _read_json(text, path) if path.suffix == ".json" else _read_yaml(text, path)
    return parse_tenants(data, str(path), default_ttl)


def _read_json(text: str, path: Path) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise SettingsError(f"{path}: not valid JSON ({_first_line(exc)})") from None


def _read_yaml(text: str, path: Path) -> object:
    import yaml

    class Loader(yaml.SafeLoader):
        """Safe YAML without dates: `2024-13-45` stays text, which the field's own check then names."""

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise SettingsError(f"{path}: not valid YAML ({at}{exc.problem or _first_line(exc)})") from None
    except RecursionError:
        raise SettingsError(f"{path}: not valid YAML (nested too deeply)") from None
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # e.g. `!!timestamp 2024-13-45`
        raise SettingsError(f"{path}: not valid YAML ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def parse_tenants(data: object, where: str = "tenants", default_ttl: TierTTL = TierTTL()) -> TenantsConfig:
    """Check the parsed contents of a tenants file; SettingsError names `where`, the field and the fix."""
    if data is None:
        raise SettingsError(f"{where}: empty; expected a mapping with a non-empty 'tenants' mapping of name -> terms")
    if not isinstance(data, Mapping):
        raise SettingsError(
            f"{where}: expected a mapping with a non-empty 'tenants' mapping of name -> terms, got {_kind(data)}"
        )
    unknown = [str(k) for k in data if k not in _TOP_KEYS]
    if unknown:
        raise SettingsError(f"{where}: unknown keys {sorted(unknown)}; valid: {', '.join(_TOP_KEYS)}")
    tenants = data.get("tenants")
    if not isinstance(tenants, Mapping) or not tenants:
        raise SettingsError(f"{where}: tenants: expected a non-empty mapping of name -> terms, got {_kind(tenants)}")
    cap = data.get("cap_fraction", 0.5)
    if not _is_number(cap) or not 0 < cap <= 1:
        raise SettingsError(f"{where}: cap_fraction: expected a number in (0, 1], e.g. 0.5, got {_show(cap)}")
    specs, by_key = [], {}
    for name, terms in tenants.items():
        specs.append(_tenant(name, terms, where, default_ttl, by_key))
    shared = _shared_prefixes(data.get("shared_prefixes", []), where)
    return TenantsConfig(tuple(specs), float(cap), shared, by_key)


def _tenant(name: object, terms: object, where: str, default_ttl: TierTTL, by_key: dict) -> TenantSpec:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SettingsError(
            f"{where}: tenants: name {_show(name)}: expected 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )
    at = f"{where}: tenants.{name}"
    if not isinstance(terms, Mapping):
        raise SettingsError(f"{at}: expected a mapping of {', '.join(_TENANT_KEYS)}, got {_kind(terms)}")
    unknown = [str(k) for k in terms if k not in _TENANT_KEYS]
    if unknown:
        raise SettingsError(f"{at}: unknown keys {sorted(unknown)}; valid: {', '.join(_TENANT_KEYS)}")
    keys = terms.get("api_keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and _KEY.fullmatch(k) for k in keys):
        raise SettingsError(
            f"{at}.api_keys: expected a non-empty list of key strings (1-256 printable ASCII "
            f"characters, no spaces), got {_show(keys)}"
        )
    for key in keys:
        if key in by_key and by_key[key] != name:
            raise SettingsError(f"{at}.api_keys: key {key[:4]}... already belongs to tenant {by_key[key]!r}")
        by_key[key] = TenantId(name)
    quota = _count(terms, "quota_pages", at)
    reserved = _count(terms, "reserved_device_pages", at) or 0
    if quota is not None and reserved > quota:
        raise SettingsError(
            f"{at}.reserved_device_pages: {reserved} exceeds its quota_pages ({quota}); reserve at most the quota"
        )
    ttl = None
    if "device_ttl_s" in terms or "host_ttl_s" in terms:
        device = _seconds(terms, "device_ttl_s", at, default_ttl.device_s)
        host = _seconds(terms, "host_ttl_s", at, default_ttl.host_s)
        if device > host:
            raise SettingsError(
                f"{at}.device_ttl_s: {device:g} s exceeds host_ttl_s ({host:g} s); a page leaves "
                "device before it leaves host"
            )
        ttl = TierTTL(device, host)
    return TenantSpec(TenantId(name), tuple(keys), quota, reserved, ttl)


def _count(terms: Mapping, name: str, at: str) -> int | None:
    value = terms.get(name)
    if value is None and name not in terms:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SettingsError(f"{at}.{name}: expected a whole number of pages >= 0, got {_show(value)}")
    return value


def _seconds(terms: Mapping, name: str, at: str, default: float) -> float:
    value = terms.get(name, default)
    if not _is_number(value) or not 0 <= value <= MAX_TTL_S:
        raise SettingsError(f"{at}.{name}: expected a number of seconds in [0, {MAX_TTL_S:g}], got {_show(value)}")
    return float(value)


def _shared_prefixes(value: object, where: str) -> tuple[SharedPrefix, ...]:
    at = f"{where}: shared_prefixes"
    if not isinstance(value, list):
        raise SettingsError(f"{at}: expected a list of texts or token-id lists, got {_kind(value)}")
    out: list[SharedPrefix] = []
    for i, entry in enumerate(value):
        if isinstance(entry, str) and entry:
            out.append(entry)
        elif (
            isinstance(entry, list)
            and entry
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in entry)
        ):
            out.append(tuple(entry))
        else:
            raise SettingsError(
                f"{at}[{i}]: expected a non-empty text or a non-empty list of token ids >= 0, got {_show(entry)}"
            )
    return tuple(out)


def _is_number(value: object) -> bool:
    """A finite int or float (not a bool, which YAML reads from yes/no)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _kind(value: object) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {_show(value)}"


def _show(value: object) -> str:
    """A short one-line repr of a value from the file."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
