"""`EntryIndex`: the disk tier's SQLite index `cache.db`, one row per entry, opened read-write or read-only.

A row holds an entry's key, size and heat and, for a small value, the value itself (a larger one
is a file named after the key, `disk_files.py`). Only rows with a key of 64 lowercase hex chars
count (`OURS`); any other row is invisible but to `verify`. Every process (every thread) has its
own connection in WAL mode; a change holds SQLite's write lock (`BEGIN IMMEDIATE`) until it commits.
Read-only, SQLite opens the file with `mode=ro`; a WAL database whose `-shm` file is absent cannot
be opened that way from a folder SQLite may not write to, and is opened `immutable=1`: sound, as no
process can write through such a folder (a writer elsewhere would have left the `-shm` file).
A disk too full to create the `-shm` file (or any write failure at open) opens the index read-only
the same way, for this process: reopen the store once space is freed.
SQLite's damage errors, a file of another format and a link (or a FIFO...) in place of any of the
index's files (`INDEX_SUFFIXES`, checked before every connection: SQLite opens them by path, following
links) become `StoreDamagedError` naming the fix.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import DB_NAME, StoreDamagedError, damage_guard, is_damage, is_full_error, is_read_only_error
from .heat import bump_heat_time
from .no_follow import UnsafePathError, check_files

logger = logging.getLogger(__name__)
FORMAT = 1  # `PRAGMA user_version` of an index in this layout
SCHEMA = (
    "CREATE TABLE entries (key TEXT PRIMARY KEY, size INTEGER NOT NULL, heat REAL, value BLOB)",
    "CREATE INDEX entries_heat ON entries (heat)",
    f"PRAGMA user_version = {FORMAT}",
)
OURS = "(typeof(key) = 'text' AND length(key) = 64 AND key NOT GLOB '*[^0-9a-f]*')"  # rows this store writes
INDEX_SUFFIXES = ("", "-wal", "-shm", "-journal")  # the files SQLite opens for an index `cache.db`, by path


def _bump_heat(old: object, now: float, half_life_s: float) -> float:
    valid = type(old) in (int, float) and math.isfinite(old)  # the index is untrusted data
    return bump_heat_time(old if valid else None, now, half_life_s)


def connect(db: Path, timeout_s: float, read_only: bool = False) -> sqlite3.Connection:
    """A connection to the index `db` in autocommit mode (transactions are explicit);
    `UnsafePathError` when one of its files is a link or not a regular file."""
    check_files(db.parent, [f"{db.name}{suffix}" for suffix in INDEX_SUFFIXES])
    options = dict(timeout=timeout_s, isolation_level=None, check_same_thread=False)
    if not read_only:
        con = sqlite3.connect(str(db), **options)
        con.execute("PRAGMA synchronous = NORMAL")  # with WAL: a killed process loses no commit
        con.create_function("bump_heat", 3, _bump_heat, deterministic=True)
        return _distrust_schema(con)
    uri = db.resolve().as_uri()
    try:
        return _distrust_schema(sqlite3.connect(f"{uri}?mode=ro", uri=True, **options))
    except sqlite3.OperationalError as exc:
        if "unable to open" not in str(exc) and not is_full_error(exc):
            raise
    logger.info("opening %s immutable: it is in WAL mode and its folder cannot hold the -shm file", db)
    return _distrust_schema(sqlite3.connect(f"{uri}?immutable=1", uri=True, **options))


def _distrust_schema(con: sqlite3.Connection) -> sqlite3.Connection:
    """No trigger or view a crafted file brings may call this process's functions; reads the file."""
    try:
        con.execute("PRAGMA trusted_schema = OFF")
        con.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except BaseException:
        con.close()
        raise
    return con


@contextmanager
def transaction(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: SQLite's write lock, held until it commits (or rolls back on error)."""
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # a failed COMMIT may have ended it already
        raise


def create_index(con: sqlite3.Connection) -> None:
    """Give a new database this format's table (any other is left as it is), in WAL mode."""
    with transaction(con):
        empty = not con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if empty and con.execute("PRAGMA user_version").fetchone()[0] == 0:
            for statement in SCHEMA:
                con.execute(statement)
        ours = con.execute("PRAGMA user_version").fetchone()[0] == FORMAT
    if ours:  # kept in the file; also undoes a mode someone else set there
        con.execute("PRAGMA journal_mode = WAL")


class EntryIndex:
    """The index of one store folder; thread-safe. `read_only_reason` is None when it takes writes."""

    def __init__(self, directory: Path, timeout_s: float, read_only_reason: str | None):
        self.directory, self.read_only_reason, self._timeout_s = directory, read_only_reason, timeout_s
        self._lock, self._local, self._connections = threading.Lock(), threading.local(), []
        try:
            with damage_guard(directory):
                self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        if self.read_only_reason is None:
            try:
                create_index(self._connection())
            except (sqlite3.OperationalError, OSError) as exc:
                if is_damage(exc) or not (is_read_only_error(exc) or is_full_error(exc)):
                    raise
                hint = "; is the disk full? reopen the store once space is freed" if is_full_error(exc) else ""
                self.read_only_reason = f"opening it for writing failed: {exc}{hint}"
                self.close()
        con = self._connection()
        if con is None:
            return  # read-only, and no index yet: an empty store
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version != FORMAT:
            raise StoreDamagedError(self.directory, f"it is not an index of this store's format {FORMAT} (found "
                                    f"{version}); the entry files of an older store are indexed again by the repair")
        con.execute(f"SELECT count(*) FROM entries WHERE {OURS}").fetchall()  # damage shows here, not mid-query

    def _connection(self) -> sqlite3.Connection | None:
        """This thread's connection; None when read-only without an index yet."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # a forked child must not use its parent's
            local.con, local.pid = None, os.getpid()
        if local.con is None:
            db = self.directory / DB_NAME
            if self.read_only_reason is not None and not os.path.lexists(db):
                return None
            try:
                local.con = connect(db, self._timeout_s, self.read_only_reason is not None)
            except UnsafePathError as exc:
                raise StoreDamagedError(self.directory, exc.strerror) from None
            with self._lock:
                self._connections.append(local.con)
        return local.con

    def rows(self, statement: str, params: tuple = ()) -> list[tuple]:
        """The rows of one statement ([] when read-only without an index yet)."""
        with damage_guard(self.directory):
            con = self._connection()
            return [] if con is None else con.execute(statement, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Hold the write lock: what `rows` does and the files changed meanwhile commit together."""
        with damage_guard(self.directory), transaction(self._connection()):
            yield

    def close(self) -> None:
        with self._lock:
            for con in self._connections:
                con.close()
            self._connections.clear()
        self._local = threading.local()
