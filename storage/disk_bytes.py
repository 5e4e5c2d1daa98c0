"""`DiskBytes`: the disk's `ByteTier`, encoded entries in a diskcache folder.

Safety properties, and where they come from:

* Several processes may use one folder at once: every write is a SQLite transaction and each
  process (each thread) has its own connection.
* An interrupted writer never leaves a half entry that reads as valid: a large value is written to a
  fresh file first and only then is the row pointing at it committed, and a small value lives inside
  that row. Every value carries the frame checksum, so a damaged or truncated value is detected on
  read (by `CodedTier`), logged, deleted and reported as a miss.
* The store runs no code and touches no file outside its folder, whatever `cache.db` says: values
  are read only as raw bytes, never unpickled, and files only inside the folder (see
  `safe_disk.py`). Rows not in our form are ignored and reported by `verify`.
* A failed write (full disk, quota, read-only file system, lock timeout) is never fatal: `put`
  removes the partial file, logs, and returns False, or raises `StoreWriteError` with `persist=True`.
* A read-only folder (or `read_only=True`) opens and serves hits; writes are skipped, said once.
* A damaged or missing index raises `StoreDamagedError` naming the fix instead of a SQLite traceback.
* The tier never stays above its budget: after each write the coldest entries are deleted one at a
  time until the volume (entry bytes plus the SQLite db) is within `budget_bytes`. Cold means low
  heat: the access count with exponential decay (half-life `heat_half_life_s` of wall time), kept
  in the index so every process sharing the folder counts and sees the same (`DiskIndex.touch`). diskcache's own culling removes ten at
  a time, so it is switched off (`cull_limit=0`) and `DiskIndex` reads diskcache's `Cache` table to
  find the coldest entry (schema stable since diskcache 4; a test covers it).
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
from pathlib import Path

import diskcache

from .byte_tier import Classify
from .disk_index import DiskIndex, Row
from .errors import DB_NAME, StoreDamagedError, StoreWriteError
from .frame import CorruptEntryError
from .keys import check_key, is_store_key
from .safe_disk import entry_files
from .stats import TierStats
from .verify import Verifier, VerifyReport

logger = logging.getLogger(__name__)
WRITE_FAILURES = (OSError, sqlite3.Error, diskcache.Timeout)
_WARN_EVERY = 100  # after the first failed write, warn again every this many (a full disk fails them all)


class DiskBytes:
    """Values (bytes) by store key in a diskcache folder, within `budget_bytes`; a `ByteTier`."""

    name = "disk"

    def __init__(
        self,
        directory: str | Path,
        budget_bytes: int,
        *,
        min_file_bytes: int = 32 * 1024,
        timeout_s: float = 60.0,
        read_only: bool = False,
        heat_half_life_s: float = 3600.0,
    ):
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self.corrupt_count = self.evictions = self.write_failures = 0
        self._counter_lock = threading.Lock()
        self._prepare_folder(read_only)
        self._index = DiskIndex(self.directory, read_only=read_only, min_file_bytes=min_file_bytes, timeout_s=timeout_s,
                               heat_half_life_s=heat_half_life_s)  # fmt: skip
        try:
            self._index.count()  # reads every row: a damaged index fails here, at open, not mid-query
        except BaseException:
            self._index.close()
            raise
        if self.read_only:
            logger.warning("KV store at %s is read-only (%s): entries are served, new ones are not saved",
                           self.directory, self._index.read_only_reason)  # fmt: skip

    def _prepare_folder(self, read_only: bool) -> None:
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"store folder {str(self.directory)!r} exists and is not a folder")
        if not self.directory.exists():
            if read_only:
                raise ValueError(f"read-only store folder {str(self.directory)!r} does not exist")
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreWriteError(self.directory, None, exc) from exc
        if not (self.directory / DB_NAME).exists():
            orphaned = sum(1 for _ in entry_files(self.directory))
            if orphaned:
                raise StoreDamagedError(self.directory, f"{DB_NAME} is missing but {orphaned} entry files remain")

    def __repr__(self) -> str:
        return f"DiskBytes({str(self.directory)!r}, entries={len(self)}, used={self.used_bytes}/{self.budget_bytes} B)"

    @property
    def read_only(self) -> bool:
        """True when the folder cannot take writes (detected at open) or `read_only=True` was given."""
        return self._index.read_only

    def __contains__(self, key: object) -> bool:
        return is_store_key(key) and self._index.row(key) is not None

    def __len__(self) -> int:
        return self._index.count()

    def keys(self) -> list[str]:
        return self._index.keys()

    @property
    def used_bytes(self) -> int:
        """diskcache's volume: entry files plus the SQLite db."""
        return self._index.volume()

    def stats(self) -> TierStats:
        return TierStats(self.name, len(self), self.used_bytes, self.budget_bytes)

    def _count(self, name: str) -> None:
        with self._counter_lock:
            setattr(self, name, getattr(self, name) + 1)

    # ----------------------------------------------------------------------------- writes
    def put(self, key: str, data: bytes, *, persist: bool = False) -> bool:
        """Write `data` under `key`; True when stored.

        False (with a warning) when it does not fit the budget, the store is read-only or the write
        failed (full disk...). With `persist=True` each of those raises `StoreWriteError` instead.
        """
        check_key(key)
        if self.read_only:
            return self.refuse(key, persist, OSError(errno.EROFS, "the store is read-only"))
        if len(data) > self.budget_bytes:
            logger.warning("disk tier: entry %s of %d bytes exceeds the disk budget of %d bytes; not stored",
                           key, len(data), self.budget_bytes)  # fmt: skip
            too_big = ValueError(f"{len(data)} bytes exceed the disk budget of {self.budget_bytes}")
            return self.refuse(key, persist, too_big)
        try:
            fits = self._write(key, data)
        except WRITE_FAILURES as exc:
            return self._write_failed(key, persist, exc)
        if not fits:
            logger.warning("disk tier: no room for entry %s within %d bytes; not stored", key, self.budget_bytes)
            no_room = ValueError(f"no room within the disk budget of {self.budget_bytes} bytes")
            return self.refuse(key, persist, no_room)
        return True

    def _write(self, key: str, data: bytes) -> bool:
        self._index.set(key, data)
        self._make_room(protect=key)
        if self._index.volume() <= self.budget_bytes:
            return True
        self._delete(key)
        return False

    def refuse(self, key: str, persist: bool, cause: BaseException) -> bool:
        """False, or with `persist` the `StoreWriteError` saying why `key` was not stored."""
        if persist:
            raise StoreWriteError(self.directory, key, cause)
        return False

    def _write_failed(self, key: str, persist: bool, exc: BaseException) -> bool:
        self._count("write_failures")
        if isinstance(exc, diskcache.Timeout):
            exc = TimeoutError(f"{DB_NAME} stayed locked by another process (or refused a write) past the timeout")
        error = StoreWriteError(self.directory, key, exc)
        if persist:
            raise error from exc
        if self.write_failures == 1 or self.write_failures % _WARN_EVERY == 0:
            logger.warning("%s; not stored on disk (%d failed writes so far)", error, self.write_failures)
        else:
            logger.debug("%s", error)
        return False

    def _make_room(self, protect: str) -> None:
        """Delete the coldest entries (never `protect`) until the volume fits the budget."""
        while self._index.volume() > self.budget_bytes:
            row = self._index.coldest(protect)
            if row is None:
                return
            if self._index.delete_row(row):
                self._count("evictions")

    def _delete(self, key: str) -> bool:
        while (row := self._index.row(key)) is not None:
            if self._index.delete_row(row):
                return True
        return False  # a concurrent rewrite changes the row: the loop re-reads it

    # ----------------------------------------------------------------------------- reads
    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None when absent or unreadable (rows in a form this
        store never writes are deleted, I/O errors logged). A read adds to the entry's shared heat."""
        check_key(key)
        row = self._index.row(key)
        if row is None:
            return None
        try:
            data = self._index.read(row)
        except FileNotFoundError:
            return None  # rewritten or deleted by another process meanwhile; `verify` reports lost files
        except CorruptEntryError as exc:  # UnsafeRowError: a row this store never writes
            self._count("corrupt_count")
            self._drop_row(row, exc)
            return None
        except OSError as exc:
            logger.warning("disk tier: entry %s in %s could not be read (%s); treated as a miss",
                           key, self.directory, exc)  # fmt: skip
            return None
        self._index.touch(row)
        return data

    def discard(self, key: str, data: bytes) -> bool:
        """Delete `key`'s row if it still holds `data`; a row another process rewrote is kept."""
        if self.read_only:
            return False
        row = self._index.row(key)
        try:
            if row is None or self._index.read(row) != data:
                return False
        except (OSError, CorruptEntryError):
            return False
        return self._drop_row(row, None)

    def _drop_row(self, row: Row, exc: CorruptEntryError | None) -> bool:
        if exc is not None:
            skipped = "; skipped (read-only store)" if self.read_only else "; deleting it"
            logger.warning("disk tier: entry %s in %s is corrupt (%s)%s", row.key, self.directory, exc, skipped)
        if self.read_only:
            return False
        try:  # another process may have rewritten the key since we read it: delete only the row we read
            return self._index.delete_row(row)
        except WRITE_FAILURES as error:  # a full disk must not turn a miss into a failed query
            logger.warning("disk tier: could not delete corrupt entry %s: %s", row.key, error)
            return False

    # ----------------------------------------------------------------------------- whole tier
    def delete(self, key: str) -> bool:
        """Remove `key`; False when absent or the store is read-only, `StoreWriteError` when it fails."""
        check_key(key)
        if self.read_only:
            return False
        try:
            return self._delete(key)
        except WRITE_FAILURES as exc:
            raise StoreWriteError(self.directory, key, exc) from exc

    def verify(self, classify: Classify, repair: bool = False) -> VerifyReport:
        """Classify every entry. Corrupt ones are always deleted (as `get` does); with `repair`, stale
        and mis-keyed entries, rows whose file is gone, rows not in our form and entry files no row
        references (older than `verify.ORPHAN_GRACE_S`) are removed too; without, only listed."""
        if repair and self.read_only:
            read_only = OSError(errno.EROFS, "the store is read-only; cannot repair it")
            raise StoreWriteError(self.directory, None, read_only)
        try:
            return Verifier(self._index, repair, classify).run()
        except WRITE_FAILURES as exc:
            raise StoreWriteError(self.directory, None, exc) from exc

    def clear(self) -> None:
        """Delete every entry (and entry files no row references, past the orphan grace period)."""
        if self.read_only:
            raise StoreWriteError(self.directory, None, OSError(errno.EROFS, "the store is read-only; cannot clear it"))
        try:
            self._index.clear()
        except WRITE_FAILURES as exc:
            raise StoreWriteError(self.directory, None, exc) from exc
        Verifier(self._index, repair=True, classify=None).reclaim_orphans(VerifyReport())

    def close(self) -> None:
        self._index.close()
