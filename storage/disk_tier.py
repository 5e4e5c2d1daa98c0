"""Disk tier: codec bytes in a `diskcache.Cache` directory, the persistent home of entries.

Safety properties, and where they come from:

* Several processes may use one directory at once: every diskcache write is a SQLite transaction
  and each process opens its own connection.
* An interrupted writer never leaves a half entry that reads as valid: diskcache writes a large
  value to a fresh file first and only then inserts the row pointing at it (one transaction), and a
  small value lives inside that row. On top of that every value carries the codec checksum, so a
  damaged or truncated file is detected on read, logged, deleted and reported as a miss.
* The tier never stays above its budget: after each write the least recently used entries (by
  diskcache's shared `access_time`, so across processes) are deleted one at a time until the volume
  (entry bytes plus the SQLite db) is within `budget_bytes`. diskcache's own culling removes ten at
  a time, so it is switched off (`cull_limit=0`) and this tier reads diskcache's `Cache` table to
  find the coldest entry (schema stable since diskcache 4; a test covers it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import diskcache
import torch

from .codec import CorruptEntryError, decode, encode
from .entry import KVEntry

logger = logging.getLogger(__name__)


@dataclass
class VerifyReport:
    """What `verify` found: how many entries it checked and the keys of corrupt ones it removed."""

    checked: int = 0
    corrupt: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.corrupt


class DiskTier:
    """Entries as checksummed bytes in a diskcache directory, within `budget_bytes`.

    Example:
        >>> import tempfile, torch
        >>> tier = DiskTier(tempfile.mkdtemp(), budget_bytes=2**20)
        >>> e = KVEntry((1,), torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))
        >>> tier.put("k" * 64, e), tier.get("k" * 64).bitwise_equal(e)
        (True, True)
        >>> tier.close()
    """

    name = "disk"

    def __init__(
        self,
        directory: str | Path,
        budget_bytes: int,
        *,
        storage_dtype: torch.dtype | None = None,
        min_file_bytes: int = 32 * 1024,
        timeout_s: float = 60.0,
    ):
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self.storage_dtype = storage_dtype
        self.corrupt_count = 0
        self.evictions = 0
        self._cache = diskcache.Cache(
            str(self.directory),
            timeout=timeout_s,
            size_limit=budget_bytes,
            eviction_policy="least-recently-used",
            cull_limit=0,
            disk_min_file_size=min_file_bytes,
            statistics=False,
        )

    def __repr__(self) -> str:
        return f"DiskTier({str(self.directory)!r}, entries={len(self)}, used={self.used_bytes}/{self.budget_bytes} B)"

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    def keys(self) -> list[str]:
        return list(self._cache.iterkeys())

    @property
    def used_bytes(self) -> int:
        """diskcache's volume: entry files plus the SQLite db."""
        return self._cache.volume()

    def put(self, key: str, entry: KVEntry) -> bool:
        """Write `entry`; return False (with a warning) when it cannot fit in the budget."""
        data = encode(entry, self.storage_dtype)
        if len(data) > self.budget_bytes:
            logger.warning(
                "disk tier: entry %s of %d bytes exceeds the disk budget of %d bytes; not stored",
                key, len(data), self.budget_bytes,
            )
            return False
        self._cache.set(key, data, retry=True)
        self._make_room(protect=key)
        if self._cache.volume() > self.budget_bytes:
            self._cache.delete(key, retry=True)
            logger.warning("disk tier: no room for entry %s within %d bytes; not stored", key, self.budget_bytes)
            return False
        return True

    def _make_room(self, protect: str) -> None:
        """Delete least recently used entries (never `protect`) until the volume fits the budget."""
        while self._cache.volume() > self.budget_bytes:
            rows = self._cache._sql(  # diskcache's Cache table; see the module docstring
                "SELECT key FROM Cache WHERE key != ? ORDER BY access_time LIMIT 1", (protect,)
            ).fetchall()
            if not rows:
                return
            self._cache.delete(rows[0][0], retry=True)
            self.evictions += 1

    def _read(self, key: str) -> bytes | None:
        # read=True returns an open file for file-backed values: the SQLite lock covers only the
        # lookup, the bytes are read after it. An open file stays readable if it is deleted meanwhile.
        value = self._cache.get(key, default=None, read=True, retry=True)
        if value is None or isinstance(value, bytes):
            return value
        with value:
            return value.read()

    def get(self, key: str) -> KVEntry | None:
        """The entry stored under `key`, or None when absent or corrupt (corrupt ones are deleted)."""
        data = self._read(key)
        if data is None:
            return None
        try:
            return decode(data)
        except CorruptEntryError as exc:
            self._drop_corrupt(key, data, exc)
            return None

    def _drop_corrupt(self, key: str, data: bytes, exc: CorruptEntryError) -> None:
        self.corrupt_count += 1
        logger.warning("disk tier: entry %s in %s is corrupt (%s); deleting it", key, self.directory, exc)
        with self._cache.transact(retry=True):
            # Another process may have rewritten the key since we read it: delete only what we read.
            if self._read(key) == data:
                self._cache.delete(key, retry=True)

    def delete(self, key: str) -> bool:
        return bool(self._cache.delete(key, retry=True))

    def verify(self) -> VerifyReport:
        """Decode every entry; delete and report the corrupt ones."""
        report = VerifyReport()
        for key in self.keys():
            data = self._read(key)
            if data is None:
                continue  # removed by another process meanwhile
            report.checked += 1
            try:
                decode(data)
            except CorruptEntryError as exc:
                self._drop_corrupt(key, data, exc)
                report.corrupt.append(key)
        return report

    def clear(self) -> None:
        self._cache.clear(retry=True)

    def close(self) -> None:
        self._cache.close()
