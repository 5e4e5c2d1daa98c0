"""Errors of the disk tier that callers act on: a damaged index, and a write that did not persist.

Both name the store folder and say what to do, so a user sees a fix rather than a SQLite traceback.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path

DB_NAME = "cache.db"  # diskcache's index file
REPAIR_HINT = "run 'fusionrag cache verify --repair --store {dir}' to rebuild it from the entry files, " \
    "or 'fusionrag cache clear --yes --store {dir}' to start empty"  # fmt: skip
# SQLite answers a damaged file with these codes; a foreign schema gives "no such table/column".
_DAMAGE_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_DAMAGE_WORDS = ("malformed", "not a database", "no such table", "no such column")


class StoreDamagedError(ValueError):
    """The store's index (`cache.db`) is unreadable or missing while entry files remain.

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


@contextmanager
def damage_guard(directory: str | Path):
    """Turn SQLite's damage errors into `StoreDamagedError` naming the store and the fix."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if is_damage(exc):
            raise StoreDamagedError(directory, str(exc)) from exc
        raise
