"""`DiskIndex`: the disk tier's rows in diskcache's `Cache` table, opened read-write or read-only.

* Read-write, the index is a `diskcache.Cache` over `SafeDisk`: its SQLite transactions make several
  writing processes safe, and a value file is complete before the row naming it is committed.
* Reads never go through diskcache's `get` (which would unpickle on a row's say-so): one SQL select
  of our row, then `SafeDisk.fetch`. Both modes share this path.
* Read-only (a precomputed store shared on a read-only mount, or `read_only=True`), SQLite opens
  `cache.db` with `mode=ro`. A WAL database whose `-shm` file is absent cannot be opened that way
  from a folder SQLite may not write to; then it is opened `immutable=1`, which is sound because
  no process can write through such a folder (a writer elsewhere would have left the `-shm` file).
* Only rows in our form count: `raw = 1` and a key of 64 lowercase hex chars (`OURS`). Any other row
  (a pickled key, say) is invisible to `keys`, `count`, `get` and eviction; `verify` reports it.
* SQLite's damage errors become `StoreDamagedError` wherever they surface.
* Heat: a row's `access_time` column holds its heat time (see `heat.bump_heat_time`), so every
  process sharing the folder reads and bumps the same heat, and the index diskcache keeps on that
  column orders eviction. diskcache writes the time of a write there: heat 1 then.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import diskcache
from diskcache.core import METADATA

from .errors import DB_NAME, StoreDamagedError, damage_guard
from .heat import bump_heat_time
from .safe_disk import SafeDisk

logger = logging.getLogger(__name__)
OURS = "(raw IS 1 AND typeof(key) = 'text' AND length(key) = 64 AND key NOT GLOB '*[^0-9a-f]*')"
_ROW = "rowid, key, mode, filename, value, store_time"
_TOUCH_TRIES = 4  # compare-and-set rounds against concurrent readers of one row
# Every diskcache setting is passed explicitly: diskcache would otherwise take them from cache.db's
# Settings table, runs `sqlite_*` ones as PRAGMAs and sets any other as an attribute of the Cache.
# The "least-recently-used" policy only makes diskcache index `access_time` (culling is off): that
# column holds the heat time our eviction orders by.
_SETTINGS = {**diskcache.DEFAULT_SETTINGS, "statistics": 0, "eviction_policy": "least-recently-used", "cull_limit": 0}
_KNOWN_SETTINGS = set(diskcache.DEFAULT_SETTINGS) | set(METADATA)
_INSERT = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode, filename, value)"
    " VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, 2, ?, NULL)"  # mode 2: diskcache's MODE_BINARY, a file
)


@dataclass(frozen=True)
class Row:
    """One row of the `Cache` table. `(rowid, store_time, filename)` identifies its version: a
    rewrite of the key keeps the rowid but gets a new store time (and file)."""

    rowid: int
    key: object
    mode: object
    filename: object
    value: object
    store_time: object


def unwritable_reason(directory: Path) -> str | None:
    """Why the store folder cannot take writes, or None when it can (as far as `access` tells)."""
    if not os.access(directory, os.W_OK):
        return "its folder is not writable"
    db = directory / DB_NAME
    if db.exists() and not os.access(db, os.W_OK):
        return f"{DB_NAME} is not writable"
    return None


def is_read_only_error(exc: BaseException) -> bool:
    """Whether opening for write failed because the folder or file is read-only (not damage)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    return name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM")) or \
        "readonly" in text or "unable to open" in text  # fmt: skip


class DiskIndex:
    """Rows of one store folder. Thread-safe: every thread gets its own SQLite connection."""

    def __init__(self, directory: Path, *, read_only: bool, min_file_bytes: int, timeout_s: float,
                 heat_half_life_s: float = 3600.0):  # fmt: skip
        self.directory = Path(directory)
        self.heat_half_life_s = heat_half_life_s
        self.read_only_reason = "opened with read_only=True" if read_only else None
        self._timeout_s = timeout_s
        self._cache: diskcache.Cache | None = None
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.disk = SafeDisk(str(self.directory), min_file_bytes)
        if not read_only:
            self._open_writable(min_file_bytes, timeout_s)

    @property
    def read_only(self) -> bool:
        return self._cache is None

    def _open_writable(self, min_file_bytes: int, timeout_s: float) -> None:
        reason = unwritable_reason(self.directory)
        if reason is None:
            self._check_settings()
            try:
                with damage_guard(self.directory):
                    settings = {**_SETTINGS, "disk_min_file_size": min_file_bytes}
                    self._cache = diskcache.Cache(str(self.directory), timeout=timeout_s, disk=SafeDisk, **settings)
            except (sqlite3.OperationalError, OSError) as exc:
                if not is_read_only_error(exc):
                    raise
                reason = f"opening it for writing failed: {exc}"
            else:
                self.disk = self._cache.disk
                return
        self.read_only_reason = reason

    def _check_settings(self) -> None:
        """Refuse a cache.db whose Settings diskcache would act on but this store never writes."""
        db = self.directory / DB_NAME
        if not db.exists():
            return
        try:
            con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=self._timeout_s)
            try:
                names = {name for (name,) in con.execute("SELECT key FROM Settings")}
            finally:
                con.close()
        except sqlite3.Error:
            return  # no Settings table yet, or damage: opening the Cache reports it
        acted_on = ("sqlite_", "disk_", "_")  # PRAGMAs, Disk arguments, Cache attributes
        odd = sorted(str(n) for n in names - _KNOWN_SETTINGS if not isinstance(n, str) or n.startswith(acted_on))
        if odd:
            problem = f"its Settings table holds keys this store never writes: {', '.join(odd)[:200]}"
            raise StoreDamagedError(self.directory, problem)

    # ----------------------------------------------------------------------------- SQL
    def execute(self, statement: str, params: tuple = ()) -> list[tuple]:
        """Rows of one statement (autocommit when read-write); [] in a read-only store with no db."""
        with damage_guard(self.directory):
            if self._cache is not None:
                return self._cache._sql(statement, params).fetchall()  # diskcache's per-thread connection
            con = self._read_only_connection()
            return [] if con is None else con.execute(statement, params).fetchall()

    def _changes(self, statement: str, params: tuple) -> int:
        with damage_guard(self.directory):
            return self._cache._sql(statement, params).rowcount

    def _read_only_connection(self) -> sqlite3.Connection | None:
        if getattr(self._local, "pid", None) != os.getpid():  # a forked child must not share it
            self._local.con, self._local.pid = None, os.getpid()
        if self._local.con is None:
            db = self.directory / DB_NAME
            if not db.exists():
                return None
            self._local.con = self._connect_read_only(db)
            with self._lock:
                self._connections.append(self._local.con)
        return self._local.con

    def _connect_read_only(self, db: Path) -> sqlite3.Connection:
        uri = db.resolve().as_uri()
        options = dict(uri=True, timeout=self._timeout_s, isolation_level=None, check_same_thread=False)
        con = sqlite3.connect(f"{uri}?mode=ro", **options)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchall()
            return con
        except sqlite3.OperationalError as exc:
            con.close()
            if "unable to open" not in str(exc):
                raise
        logger.info("opening %s immutable: it is in WAL mode and its folder cannot hold the -shm file", db)
        return sqlite3.connect(f"{uri}?immutable=1", **options)

    # ----------------------------------------------------------------------------- reads
    def row(self, key: str) -> Row | None:
        rows = self.execute(f"SELECT {_ROW} FROM Cache WHERE key = ? AND raw = 1", (key,))
        return Row(*rows[0]) if rows else None

    def keys(self) -> list[str]:
        return [key for (key,) in self.execute(f"SELECT key FROM Cache WHERE {OURS}")]

    def count(self) -> int:
        rows = self.execute(f"SELECT count(*) FROM Cache WHERE {OURS}")
        return rows[0][0] if rows else 0

    def volume(self) -> int:
        """diskcache's volume: db pages plus the bytes of value files (its `Settings.size` counter)."""
        pages = self.execute("PRAGMA page_count")
        if not pages:
            return 0
        page_size = self.execute("PRAGMA page_size")[0][0]
        size = self.execute("SELECT value FROM Settings WHERE key = 'size'")
        files = size[0][0] if size and type(size[0][0]) is int and size[0][0] > 0 else 0
        return pages[0][0] * page_size + files

    def coldest(self, protect: str) -> Row | None:
        """Our coldest row other than `protect`'s (lowest heat time, kept in `access_time`)."""
        rows = self.execute(
            f"SELECT {_ROW} FROM Cache WHERE {OURS} AND key != ? ORDER BY access_time LIMIT 1", (protect,)
        )
        return Row(*rows[0]) if rows else None

    def foreign_rows(self) -> list[Row]:
        """Rows not in our form (pickled keys, other key types), without their values."""
        return [Row(*r) for r in self.execute("SELECT rowid, key, mode, filename, NULL, store_time FROM Cache"
                                              f" WHERE NOT {OURS}")]  # fmt: skip

    def referenced_files(self) -> set[str]:
        rows = self.execute("SELECT filename FROM Cache WHERE filename IS NOT NULL")
        return {os.path.normpath(name) for (name,) in rows if isinstance(name, str)}

    def read(self, row: Row) -> bytes:
        """The value bytes of `row`; `UnsafeRowError` for rows we never write, `OSError` for I/O."""
        return self.disk.fetch(row.mode, row.filename, row.value, False)

    # ----------------------------------------------------------------------------- writes
    def touch(self, row: Row) -> None:
        """Count one access of `row` in its shared heat (best effort: a hit is still a hit).

        Read, bump, then write only if no other process bumped it meanwhile (else retry), so
        concurrent readers do not lose each other's accesses."""
        if self._cache is None:
            return
        try:
            for _ in range(_TOUCH_TRIES):
                found = self.execute("SELECT access_time FROM Cache WHERE rowid = ? AND store_time IS ?",
                                     (row.rowid, row.store_time))  # fmt: skip
                if not found:
                    return  # deleted or rewritten meanwhile
                old = found[0][0]
                valid = type(old) in (int, float) and math.isfinite(old)  # the index is untrusted data
                heat_time = bump_heat_time(old if valid else None, time.time(), self.heat_half_life_s)
                if self._changes("UPDATE Cache SET access_time = ? WHERE rowid = ? AND access_time IS ?",
                                 (heat_time, row.rowid, old)):  # fmt: skip
                    return
        except (sqlite3.OperationalError, OSError) as exc:
            logger.debug("could not record an access in %s: %s", self.directory, exc)

    def set(self, key: str, data: bytes) -> None:
        """Write one value; on failure no file of it is left behind and the exception propagates."""
        self.disk.begin_write()
        try:
            with damage_guard(self.directory):
                self._cache.set(key, data, retry=False)
        except BaseException:
            self.disk.discard_written()
            self._rollback()
            raise
        finally:
            self.disk.begin_write()  # forget the committed file: it is the row's now

    def _rollback(self) -> None:
        # A COMMIT that failed (e.g. disk full) can leave the connection inside its transaction.
        try:
            self._cache._sql("ROLLBACK")
        except sqlite3.Error:
            pass  # no transaction was open

    def delete_row(self, row: Row, remove_file: bool = True) -> bool:
        """Delete `row` if no process rewrote it since it was read, then its file (inside the store only)."""
        deleted = self._changes(
            "DELETE FROM Cache WHERE rowid = ? AND store_time IS ? AND filename IS ?",
            (row.rowid, row.store_time, row.filename),
        )
        if deleted and remove_file and row.filename is not None:
            self.disk.remove(row.filename)
        return bool(deleted)

    def insert_file_rows(self, rows: list[tuple[str, str, int, float]]) -> None:
        """Index existing entry files: `(key, filename, size, mtime)` each, in one transaction."""
        with damage_guard(self.directory), self._cache.transact(retry=False):
            for key, filename, size, mtime in rows:
                self._cache._sql(_INSERT, (key, mtime, mtime, size, filename))

    def clear(self) -> None:
        with damage_guard(self.directory):
            self._cache.clear(retry=False)

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
        with self._lock:
            for con in self._connections:
                con.close()
            self._connections.clear()
