"""Byte stores of the lower KV tiers: host memory, disk files and a shared Redis, keyed by page content key.

Each store keeps whole page records: a header (magic, the KV layout fingerprint, the payload's length, an
HMAC-SHA256 over (content key, layout fingerprint, payload) under the deployment's tier secret) and the page's
bytes as `PagedKVCache.read_pages` exports them. `get` returns the payload only when the record is whole and its
MAC verifies; a record cut short or written for another layout is "corrupt", one whose MAC fails (a forged or
bit-flipped payload, another page's record copied over this one, a record written under another secret) is
"forged": either is a miss, never wrong KV. Without a secret the MAC is keyed with the empty key: it still
catches corruption and copied records, but anyone who can write to the store can forge a record, so the engine
warns once at start when a shared remote tier has no secret. The secret and the content keys are never logged.
A store that fails (a full disk, a stopped Redis) answers False / None and says why in `StoreFailure`s its
caller counts; the engine keeps serving without that tier.

Disk page files are private to the engine's user: folders 0700, files 0600 (KV bytes are the prompts' content).

Which pages go where and when is the pure core's decision (`core.tiers`); these classes only move bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

_MAGIC = b"KVP3"
_HEADER = struct.Struct("<4s16sQ32s")  # magic, layout fingerprint, payload length, HMAC-SHA256


@dataclass(frozen=True, slots=True)
class StoreFailure:
    tier: str
    reason: str  # "full", "unavailable", "corrupt" (cut short, another layout), "forged" (the MAC fails)


def _fingerprint(fingerprint: str) -> bytes:
    return fingerprint.encode()[:16].ljust(16, b"\0")


def _mac(secret: bytes, fingerprint: str, key: str, payload: bytes) -> bytes:
    """HMAC-SHA256 over (content key, full layout fingerprint, payload), each length-prefixed so that no two
    different triples feed the same bytes."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (key.encode(), fingerprint.encode()):
        mac.update(struct.pack("<Q", len(part)) + part)
    mac.update(payload)
    return mac.digest()


def encode_record(fingerprint: str, key: str, payload: bytes, secret: bytes = b"") -> bytes:
    """The record of the page whose content key is `key`, authenticated with `secret`."""
    header = _HEADER.pack(_MAGIC, _fingerprint(fingerprint), len(payload), _mac(secret, fingerprint, key, payload))
    return header + payload


@dataclass(frozen=True, slots=True)
class Decoded:
    """What a stored record turned out to be: its payload, or why it is a miss."""

    payload: bytes | None
    failure: str | None = None  # "corrupt" or "forged" when payload is None


def decode_record(fingerprint: str, key: str, record: bytes, secret: bytes = b"") -> Decoded:
    """The payload of a whole record written for `fingerprint` and the page `key` whose MAC verifies."""
    if len(record) < _HEADER.size:
        return Decoded(None, "corrupt")
    magic, fp, length, mac = _HEADER.unpack_from(record)
    payload = record[_HEADER.size :]
    if magic != _MAGIC or fp != _fingerprint(fingerprint) or length != len(payload):
        return Decoded(None, "corrupt")
    if not hmac.compare_digest(mac, _mac(secret, fingerprint, key, payload)):
        return Decoded(None, "forged")
    return Decoded(payload)


def _verified(store: DiskStore | RedisStore, key: str, record: bytes) -> bytes | None:
    """The payload of a record a store read back, or None with the reason counted in its failures."""
    decoded = decode_record(store.fingerprint, key, record, store.secret)
    if decoded.failure is not None:
        store.failures.append(StoreFailure(store.name, decoded.failure))
    return decoded.payload


@dataclass(slots=True)
class HostStore:
    """Pages in host memory: rows of slabs allocated ahead (pinned when the device is a GPU, for async
    copies), not one allocation per page (a pinned allocation costs far more than a page's copy).
    Thread-safe: the offload executor's demotion worker puts while the step thread gets and deletes.

    `capacity` pages are allocated at start (`torch.empty`: on CPU memory is committed as rows fill). The tier
    policy keeps the tier within its budget by moving pages on after they arrive, so the store may briefly
    hold more: it then adds a slab of `capacity // 4` rows (at least 16) rather than refuse a page."""

    capacity: int
    page_bytes: int
    pin: bool = False
    name: str = "host"
    failures: list[StoreFailure] = field(default_factory=list)
    _slabs: list[torch.Tensor] = field(default_factory=list)
    _rows: list[torch.Tensor] = field(default_factory=list)
    _free: list[int] = field(default_factory=list)
    _slots: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._grow(max(self.capacity, 1))

    def _grow(self, pages: int) -> None:
        slab = torch.empty((pages, self.page_bytes), dtype=torch.uint8, pin_memory=self.pin)
        first = len(self._rows)
        self._slabs.append(slab)
        self._rows.extend(slab.unbind(0))
        self._free.extend(range(first + pages - 1, first - 1, -1))

    def put(self, key: str, payload: bytes) -> bool:
        return self.put_tensor(key, torch.frombuffer(bytearray(payload), dtype=torch.uint8))

    def put_tensor(self, key: str, row: torch.Tensor) -> bool:
        """Keep a copy of one page row (uint8 [page_bytes]) from any device."""
        if tuple(row.shape) != (self.page_bytes,):
            raise ValueError(f"a host page row is uint8 [{self.page_bytes}]; got {tuple(row.shape)}")
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                if not self._free:
                    self._grow(max(self.capacity // 4, 16))
                slot = self._free.pop()
                self._slots[key] = slot
            self._rows[slot].copy_(row)
        return True

    def get(self, key: str) -> bytes | None:
        with self._lock:  # tobytes copies the row, so no clone first (get_tensor's)
            slot = self._slots.get(key)
            return None if slot is None else self._rows[slot].numpy().tobytes()

    def get_tensor(self, key: str) -> torch.Tensor | None:
        """A copy of the page's row (the slab row itself may be reused once the page is deleted)."""
        with self._lock:
            slot = self._slots.get(key)
            return None if slot is None else self._rows[slot].clone()

    def delete(self, key: str) -> None:
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is not None:
                self._free.append(slot)

    def contains(self, key: str) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        return len(self._slots)


@dataclass(slots=True)
class DiskStore:
    """One file per page under `root/<2 hex>/<key>.kvp`, written to a temporary name and renamed into place
    (a reader never sees half a file from this writer; a torn or corrupted file fails its checksum)."""

    root: Path
    fingerprint: str
    secret: bytes = field(default=b"", repr=False)
    name: str = "disk"
    failures: list[StoreFailure] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.root.stat().st_uid == os.getuid():  # an existing folder of ours, made with a looser mode
            self.root.chmod(0o700)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.kvp"

    def put(self, key: str, payload: bytes) -> bool:
        path = self.path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            self._write_file(tmp, encode_record(self.fingerprint, key, payload, self.secret))
            os.replace(tmp, path)
            return True
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self.failures.append(StoreFailure(self.name, "full" if exc.errno == 28 else "unavailable"))
            return False

    @staticmethod
    def _write_file(path: Path, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def get(self, key: str) -> bytes | None:
        try:
            record = self.path(key).read_bytes()
        except OSError:
            return None
        return _verified(self, key, record)

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def contains(self, key: str) -> bool:
        return self.path(key).exists()


@dataclass(slots=True)
class RedisStore:
    """Pages in a Redis shared by several engines: `SET key record NX` (the first writer wins; content keys
    make every writer's bytes the same). Redis's own memory limit and eviction policy bound the tier."""

    url: str
    fingerprint: str
    secret: bytes = field(default=b"", repr=False)
    prefix: str = "kvbench:page:"
    timeout_s: float = 0.5
    name: str = "remote"
    failures: list[StoreFailure] = field(default_factory=list)
    _client: object = None

    def __post_init__(self) -> None:
        import redis

        self._client = redis.Redis.from_url(
            self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
        )

    def _call(self, fn, *args, **kwargs) -> tuple[bool, object]:
        """(reached Redis, its answer); a failure is counted, never raised."""
        import redis

        try:
            return True, fn(*args, **kwargs)
        except (redis.RedisError, OSError):
            self.failures.append(StoreFailure(self.name, "unavailable"))
            return False, None

    def put(self, key: str, payload: bytes) -> bool:
        record = encode_record(self.fingerprint, key, payload, self.secret)
        ok, _ = self._call(self._client.set, self.prefix + key, record, nx=True)
        return ok

    def get(self, key: str) -> bytes | None:
        _, record = self._call(self._client.get, self.prefix + key)
        if record is None:
            return None
        return _verified(self, key, record)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        _, records = self._call(self._client.mget, [self.prefix + k for k in keys])
        if records is None:
            return [None] * len(keys)
        return [None if r is None else _verified(self, k, r) for k, r in zip(keys, records)]

    def delete(self, key: str) -> None:
        self._call(self._client.delete, self.prefix + key)

    def contains(self, key: str) -> bool:
        return bool(self._call(self._client.exists, self.prefix + key)[1])

    def clear(self) -> None:
        """Delete every page under this store's prefix (a cache reset; other engines lose them too)."""

        def delete_all():
            for batch in _batches(self._client.scan_iter(match=self.prefix + "*", count=1000), 1000):
                self._client.delete(*batch)

        self._call(delete_all)


def _batches(items, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
