"""Errors of the store that callers act on: a damaged index, a write that did not persist, a setting
that cannot be used.

Each names the store folder (or the setting) and says what to do, so a user sees a fix rather than
a SQLite traceback.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path

DB_NAME = "cache.db"  # the disk tier's index
REPAIR_HINT = "run 'fusionrag cache verify --repair --store {dir}' to rebuild it from the entry files, " \
    "or 'fusionrag cache clear --yes --store {dir}' to start empty"  # fmt: skip
# SQLite answers a damaged file with these codes; a foreign schema gives "no such table/column".
_DAMAGE_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_DAMAGE_WORDS = ("malformed", "not a database", "no such table", "no such column")
WRITE_FAILURES = (OSError, sqlite3.Error)  # what a write to the disk tier fails with (full disk, lock timeout...)


class StoreConfigError(ValueError):
    """A store setting cannot be used: a codec name, the codec a folder records, a store folder that
    cannot be made, a remote URL. The message says what was wrong and what is allowed."""


class StoreDamagedError(ValueError):
    """The store's index (`cache.db`) is unreadable, of another format, or missing while entry files remain.

    `directory` is the store folder, `problem` what SQLite or the check reported. Both fixes keep the
    damaged index (renamed to `cache.db.damaged-<time>`), never delete it.
    """

    def __init__(self, directory: str | Path, problem: str):
        self.directory = Path(directory)
        self.problem = problem
        super().__init__(
            f"the KV store index {self.directory / DB_NAME} is damaged ({problem}); "
            + REPAIR_HINT.format(dir=self.directory)
        )

    def __reduce__(self):  # picklable across processes despite the two-argument constructor
        return type(self), (self.directory, self.problem)


class StoreWriteError(OSError):
    """An entry could not be written to the disk tier (full disk, quota, read-only store, lock timeout).

    Raised by `TieredStore.put(..., persist=True)` only: without `persist` a failed write is a logged
    warning and the entry stays in memory. An `OSError` so that code already guarding file writes
    catches it. Attributes: `directory` (store folder), `key` (None for whole-store operations such
    as `clear`) and `cause` (the original exception, also chained as `__cause__`).
    """

    def __init__(self, directory: str | Path, key: str | None, cause: BaseException):
        self.directory, self.key, self.cause = Path(directory), key, cause
        what = f"entry {key}" if key is not None else "the store"
        super().__init__(f"could not write {what} to the KV store at {directory}: {_describe(cause)}")
        self.errno = getattr(cause, "errno", None)

    def __reduce__(self):
        return type(self), (self.directory, self.key, self.cause)


def _describe(cause: BaseException) -> str:
    text = str(cause) or type(cause).__name__
    return text if isinstance(cause, (OSError, ValueError)) else f"{type(cause).__name__}: {text}"


def is_damage(exc: BaseException) -> bool:
    """Whether a SQLite error means the index file itself is damaged (not busy, full or read-only)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(_DAMAGE_CODES) or any(word in str(exc) for word in _DAMAGE_WORDS)


def is_read_only_error(exc: BaseException) -> bool:
    """Whether opening for write failed because the folder or file is read-only (not damage)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    return name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM")) or \
        "readonly" in text or "unable to open" in text  # fmt: skip


def is_full_error(exc: BaseException) -> bool:
    """Whether a write failed for want of space (full disk, quota), as far as the error tells: SQLite
    reports a `-shm` file it cannot size as a generic I/O error."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    name = getattr(exc, "sqlite_errorname", "") or ""
    return isinstance(exc, sqlite3.OperationalError) and (
        name.startswith(("SQLITE_FULL", "SQLITE_IOERR")) or "disk is full" in str(exc) or "disk I/O error" in str(exc))


def unwritable_reason(directory: Path) -> str | None:
    """Why the store folder cannot take writes, or None when it can (as far as `access` tells)."""
    if not os.access(directory, os.W_OK):
        return "its folder is not writable"
    db = directory / DB_NAME
    if db.exists() and not os.access(db, os.W_OK):
        return f"{DB_NAME} is not writable"
    return None


@contextmanager
def damage_guard(directory: str | Path):
    """Turn SQLite's damage errors into `StoreDamagedError` naming the store and the fix."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if is_damage(exc):
            raise StoreDamagedError(directory, str(exc)) from exc
        raise
