"""The disk tier: `DiskBytes`, encoded entries in a store folder (a SQLite index and files), and
`DiskTier`, a codec in front of it.

The index `cache.db` holds one row per entry: its key, size and heat and, for a value smaller than
`min_file_bytes`, the value itself; a larger value is the file named after its key (`disk_files.py`).

* Several processes may use one folder at once: each thread has its own SQLite connection (WAL),
  and every change, to rows and to files alike, is made under SQLite's write lock (`BEGIN IMMEDIATE`).
* An interrupted writer never leaves a half entry that reads as valid: a value file is written
  whole under a temporary name, then renamed into place and its row committed, under the lock.
  Every value carries the frame checksum and its key, so a damaged, truncated or swapped value is
  detected on read (by `CodedTier`), logged, deleted and reported as a miss.
* The store runs no code and touches no file outside its folder, whatever `cache.db` holds: values
  are bytes, never unpickled; file paths come from keys, never from the index, and links are never
  followed (the folder itself is resolved once, at open). Rows not in the store's form are ignored,
  and reported by `verify`; so are links planted among the entry files.
* A failed write (full disk, quota, read-only file system, lock timeout) is never fatal: `put`
  removes its temporary file, logs, and returns False, or raises `StoreWriteError` with `persist=True`.
* A read-only folder (or `read_only=True`) opens and serves hits; writes are skipped, said once.
* A damaged, missing or foreign index raises `StoreDamagedError` naming the fix (`disk_repair.py`).
* The tier never stays above its budget: after each write the coldest entries are deleted until the
  volume (entry files plus the live pages of `cache.db`) fits `budget_bytes`. Cold means low heat:
  the access count with exponential decay (half-life `heat_half_life_s` of wall time), kept in the
  index as a heat time (`heat.bump_heat_time`), so every process sharing the folder counts and sees
  the same.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from .byte_tier import ByteTierBase, Classify
from .codec import EntryCodec, RawCodec
from .coded_tier import CodedTier
from .disk_files import EntryFiles, UnsafeValueError, entry_files, entry_name
from .disk_index import OURS, EntryIndex
from .disk_repair import clear_disk, verify_disk
from .errors import DB_NAME, WRITE_FAILURES, StoreDamagedError, StoreWriteError, unwritable_reason
from .frame import CorruptEntryError
from .keys import check_key, is_store_key
from .no_follow import resolve_folder
from .stats import VerifyReport

logger = logging.getLogger(__name__)
_WARN_EVERY = 100  # after the first failed write, warn again every this many (a full disk fails them all)


class DiskBytes(ByteTierBase):
    """Values (bytes) by store key in a store folder, within `budget_bytes`; a `ByteTier`. Thread-safe."""

    name = "disk"
    shared = False

    def __init__(self, directory: str | Path, budget_bytes: int, *, min_file_bytes: int = 32 * 1024,
                 timeout_s: float = 60.0, read_only: bool = False, heat_half_life_s: float = 3600.0):  # fmt: skip
        super().__init__()
        self.directory = self.where = resolve_folder(directory)  # a link the user chose, resolved once
        self.budget_bytes, self.min_file_bytes, self.heat_half_life_s = budget_bytes, min_file_bytes, heat_half_life_s
        self._prepare_folder(read_only)
        self.files = EntryFiles(self.directory)
        try:
            reason = "opened with read_only=True" if read_only else unwritable_reason(self.directory)
            self.index = EntryIndex(self.directory, timeout_s, reason)
        except BaseException:
            self.files.close()
            raise
        if self.read_only:
            logger.warning("KV store at %s is read-only (%s): entries are served, new ones are not saved",
                           self.directory, self.index.read_only_reason)  # fmt: skip

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
        if not (self.directory / DB_NAME).exists() and (orphaned := len(entry_files(self.directory))):
            raise StoreDamagedError(self.directory, f"{DB_NAME} is missing but {orphaned} entry files remain")

    def __repr__(self) -> str:
        return f"DiskBytes({str(self.directory)!r}, entries={len(self)}, used={self.used_bytes}/{self.budget_bytes} B)"

    @property
    def read_only(self) -> bool:
        """True when the folder cannot take writes (detected at open) or `read_only=True` was given."""
        return self.index.read_only_reason is not None

    # ----------------------------------------------------------------------------- reads
    def __contains__(self, key: object) -> bool:
        return is_store_key(key) and bool(self.index.rows("SELECT 1 FROM entries WHERE key = ?", (key,)))

    def __len__(self) -> int:
        rows = self.index.rows(f"SELECT count(*) FROM entries WHERE {OURS}")
        return rows[0][0] if rows else 0

    def keys(self) -> list[str]:
        return [key for (key,) in self.index.rows(f"SELECT key FROM entries WHERE {OURS}")]

    @property
    def used_bytes(self) -> int:
        """The live pages of `cache.db` plus the entry files' sizes."""
        pages = "(SELECT * FROM pragma_page_count()) - (SELECT * FROM pragma_freelist_count())"
        files = f"SELECT total(max(size, 0)) FROM entries WHERE {OURS} AND value IS NULL"
        rows = self.index.rows(f"SELECT ({pages}) * (SELECT * FROM pragma_page_size()) + ({files})")
        return int(rows[0][0]) if rows else 0

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None when absent or unreadable (a value this store never
        writes is deleted, I/O errors logged). A read adds to the entry's shared heat."""
        check_key(key)
        try:
            data = self.value(key)
        except FileNotFoundError:
            return None  # deleted by another process meanwhile; `verify` reports lost files
        except CorruptEntryError as exc:  # UnsafeValueError: a link, a FIFO, a text value
            self._count("corrupt_count")
            action = "skipped (read-only store)" if self.read_only else "deleting it"
            logger.warning("disk tier: entry %s in %s is corrupt (%s); %s", key, self.directory, exc, action)
            self.discard(key, None)
            return None
        except OSError as exc:
            logger.warning("disk tier: entry %s in %s could not be read (%s); treated as a miss", key, self.directory, exc)
            return None
        if data is not None and not self.read_only:
            try:  # one UPDATE: concurrent readers' accesses add up
                self.index.rows("UPDATE entries SET heat = bump_heat(heat, ?, ?) WHERE key = ?",
                                (time.time(), self.heat_half_life_s, key))  # fmt: skip
            except (sqlite3.OperationalError, OSError) as exc:  # best effort: a hit is still a hit
                logger.debug("could not record an access in %s: %s", self.directory, exc)
        return data

    def value(self, key: str) -> bytes | None:
        """`key`'s bytes, in its row or its file (None: no row); `UnsafeValueError` for a value this
        store never writes, `OSError` for a file that cannot be read."""
        rows = self.index.rows("SELECT value FROM entries WHERE key = ?", (key,))
        value = rows[0][0] if rows else None
        if rows and value is None:
            return self.files.read(entry_name(key))[0]
        if value is None or type(value) is bytes:
            return value
        raise UnsafeValueError(f"refusing a value of type {type(value).__name__} (this store writes bytes only)")

    # ----------------------------------------------------------------------------- writes
    def put(self, key: str, data: bytes, *, persist: bool = False) -> bool:
        """Write `data` under `key`; True when stored.

        False (with a warning) when it does not fit the budget, the store is read-only or the write
        failed (full disk...). With `persist=True` each of those raises `StoreWriteError` instead.
        """
        check_key(key)
        refused = self.refused_put(key, data, persist)
        if refused is not None:
            return refused
        try:
            fits = self._write(key, data)
        except WRITE_FAILURES as exc:
            return self._write_failed(key, persist, exc)
        if not fits:
            logger.warning("disk tier: no room for entry %s within %d bytes; not stored", key, self.budget_bytes)
            return self.refuse(key, persist, ValueError(f"no room within the disk budget of {self.budget_bytes} bytes"))
        return True

    def _write(self, key: str, data: bytes) -> bool:
        inline = len(data) < self.min_file_bytes
        temporary = None if inline else self.files.write_temporary(key, data)  # before the lock: the slow part
        try:
            with self.index.transaction():
                if temporary is None:
                    self.files.remove(entry_name(key))  # the file of an older value, if it had one
                else:
                    self.files.install(temporary, key)
                    temporary = None
                self.index.rows("INSERT OR REPLACE INTO entries (key, size, heat, value) VALUES (?, ?, ?, ?)",
                                (key, len(data), time.time(), data if inline else None))  # fmt: skip
                fits = self._make_room(protect=key)
                if not fits:
                    self.remove(key)
            return fits
        finally:
            if temporary is not None:
                self.files.remove(temporary)

    def _make_room(self, protect: str) -> bool:
        """Delete the coldest entries (never `protect`) until the volume fits the budget; whether it does."""
        while self.used_bytes > self.budget_bytes:
            coldest = self.index.rows(f"SELECT key FROM entries WHERE {OURS} AND key != ? ORDER BY heat LIMIT 1",
                                      (protect,))  # fmt: skip
            if not coldest:
                return False
            self.remove(coldest[0][0])
            self._count("evictions")
        return True

    def remove(self, key: str) -> None:
        """Delete `key`'s row and file (inside `index.transaction()`)."""
        self.index.rows("DELETE FROM entries WHERE key = ?", (key,))
        self.files.remove(entry_name(key))

    def _write_failed(self, key: str, persist: bool, exc: BaseException) -> bool:
        self._count("write_failures")
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            exc = TimeoutError(f"{DB_NAME} stayed locked by another process past the timeout ({exc})")
        error = StoreWriteError(self.directory, key, exc)
        if persist:
            raise error from exc
        if self.write_failures == 1 or self.write_failures % _WARN_EVERY == 0:
            logger.warning("%s; not stored on disk (%d failed writes so far)", error, self.write_failures)
        else:
            logger.debug("%s", error)
        return False

    def discard(self, key: str, data: bytes | None) -> bool:
        """Delete `key` if it still holds `data` (None: a value that cannot be read); a value another
        process wrote meanwhile is kept. Never raises for a failed removal (logged)."""
        if self.read_only:
            return False
        try:
            with self.index.transaction():
                try:
                    held = self.value(key)
                except (CorruptEntryError, OSError):
                    held = None
                if held != data or key not in self:
                    return False
                self.remove(key)
                return True
        except WRITE_FAILURES as exc:  # a full disk must not turn a miss into a failed query
            logger.warning("disk tier: could not delete entry %s: %s", key, exc)
            return False

    def delete(self, key: str) -> bool:
        """Remove `key`; False when absent or the store is read-only, `StoreWriteError` when it fails."""
        check_key(key)
        if self.read_only:
            return False
        try:
            with self.index.transaction():
                found = key in self
                self.remove(key)
                return found
        except WRITE_FAILURES as exc:
            raise StoreWriteError(self.directory, key, exc) from exc

    # ----------------------------------------------------------------------------- whole tier
    def verify(self, classify: Classify, repair: bool = False) -> VerifyReport:
        """Classify every entry; corrupt ones are always deleted (as `get` does); see `disk_repair.verify_disk`."""
        return verify_disk(self, classify, repair)

    def clear(self) -> None:
        """Delete every entry; see `disk_repair.clear_disk`."""
        clear_disk(self)

    def close(self) -> None:
        self.index.close()
        self.files.close()


class DiskTier(CodedTier):
    """Entries as checksummed `codec` bytes in a store folder, within `budget_bytes`.

    `codec` defaults to the raw codec. `directory`, `read_only`, `evictions`, `write_failures` are
    the folder's.

    Example:
        >>> import tempfile, torch
        >>> from fusionrag_llm.storage.entry import KVEntry
        >>> tier = DiskTier(tempfile.mkdtemp(), budget_bytes=2**20)
        >>> e = KVEntry((1,), torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))
        >>> tier.put("ab" * 32, e), tier.get("ab" * 32).bitwise_equal(e)
        (True, True)
        >>> tier.close()
    """

    def __init__(self, directory: str | Path, budget_bytes: int, *, codec: EntryCodec | None = None,
                 min_file_bytes: int = 32 * 1024, timeout_s: float = 60.0, read_only: bool = False,
                 heat_half_life_s: float = 3600.0):  # fmt: skip
        folder = DiskBytes(directory, budget_bytes, min_file_bytes=min_file_bytes, timeout_s=timeout_s,
                           read_only=read_only, heat_half_life_s=heat_half_life_s)  # fmt: skip
        try:
            super().__init__(folder, codec if codec is not None else RawCodec())
        except BaseException:
            folder.close()
            raise
