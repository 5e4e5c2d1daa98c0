"""`SafeDisk`: diskcache's serialisation restricted to what this store writes, so `cache.db` runs no code.

diskcache's own `Disk` unpickles keys and values whose row says so (the `raw` and `mode` columns)
and opens or deletes whatever path a row's `filename` names. Anyone able to write `cache.db` could
then run code in every process that reads the store, or delete files outside it. `SafeDisk` accepts
only `str` keys and `bytes` values (stored raw in the row, or as a file in the store folder), refuses
every other mode with `UnsafeRowError`, and touches a file only when its path, with symlinks
resolved, lies inside the store folder. It never imports or calls `pickle`.

Entry files follow diskcache's layout, `ab/cd/<28 hex>.val` under the store folder;
`entry_files` lists them, so nothing else in the folder (the chunk catalog, documents) is mistaken
for one.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import stat
import threading
from collections.abc import Iterator

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

from .frame import CorruptEntryError

logger = logging.getLogger(__name__)
_HEX2 = re.compile(r"[0-9a-f]{2}\Z")
_ENTRY_FILE = re.compile(r"[0-9a-f]{28}\.val\Z")
_OPEN_RETRIES = 10  # another process may remove an emptied sub-folder between makedirs and open


class UnsafeRowError(CorruptEntryError):
    """A `cache.db` row this store did not write: pickled key or value, text, or a path outside it."""


def is_inside(root: str, path: str) -> bool:
    """Whether `path` lies strictly inside `root` (both absolute, already resolved)."""
    return path != root and os.path.commonpath([root, path]) == root


def entry_files(directory: str | os.PathLike) -> Iterator[str]:
    """Relative paths (`ab/cd/....val`) of the regular files in the entry-file layout.

    Symlinks and anything outside the two hex sub-folder levels are skipped, never followed.
    """
    for first in _subdirs(os.fspath(directory)):
        for second in _subdirs(first.path):
            with os.scandir(second.path) as items:
                for item in items:
                    if _ENTRY_FILE.match(item.name) and item.is_file(follow_symlinks=False):
                        yield f"{first.name}/{second.name}/{item.name}"


def _subdirs(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as items:
            return [i for i in items if _HEX2.match(i.name) and i.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


class SafeDisk(diskcache.Disk):
    """A `diskcache.Disk` for `str` keys and `bytes` values only; pass it as `Cache(..., disk=SafeDisk)`.

    `**_ignored` takes `disk_*` settings a foreign `cache.db` may carry, so they cannot break opening.
    """

    def __init__(self, directory, min_file_size: int = 0, pickle_protocol: int = 0, **_ignored):
        super().__init__(directory, min_file_size, pickle_protocol)
        self.root = os.path.realpath(directory)
        self._written = threading.local()  # files this thread wrote during the current `Cache.set`

    # ------------------------------------------------------------------------------ keys
    def put(self, key):
        if type(key) is not str:
            raise ValueError(f"this store's keys are str, got {type(key).__name__}")
        return key, True

    def get(self, key, raw):
        if not raw or type(key) is not str:
            raise UnsafeRowError("refusing a key stored in a form this store never writes (pickled or bytes)")
        return key

    # ------------------------------------------------------------------------------ values
    def store(self, value, read, key=UNKNOWN):
        if read or type(value) is not bytes:
            raise ValueError(f"this store writes bytes values only, got {type(value).__name__}")
        if len(value) < self.min_file_size:
            return 0, MODE_RAW, None, sqlite3.Binary(value)
        filename, full_path = self.filename(key, value)
        self._write_new(full_path, value)
        return len(value), MODE_BINARY, filename, None

    def fetch(self, mode, filename, value, read):
        if mode == MODE_RAW and type(value) is bytes:
            return value
        if mode == MODE_BINARY and value is None and isinstance(filename, str):
            handle = self.open_entry_file(filename)
            if read:
                return handle
            with handle:
                return handle.read()
        raise UnsafeRowError(f"refusing a value of mode {mode!r} (this store writes raw bytes or binary files only)")

    def open_entry_file(self, filename: str):
        """Open a row's file for reading; `UnsafeRowError` unless it is a regular file inside the store."""
        path = os.path.realpath(os.path.join(self.root, filename))
        if not is_inside(self.root, path):
            raise UnsafeRowError(f"refusing file {filename!r}: it resolves outside the store folder {self.root}")
        # O_NONBLOCK: a FIFO planted in the folder must not block the reader; it is refused below.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnsafeRowError(f"refusing file {filename!r}: not a regular file")
        return os.fdopen(fd, "rb")

    def remove(self, file_path):
        """Remove a row's file (or the symlink itself), never anything outside the store folder."""
        if not isinstance(file_path, str):
            return
        joined = os.path.join(self.root, file_path)
        # Resolve the folder part only: a symlink named by the row is removed itself, not its target.
        parent = os.path.realpath(os.path.dirname(joined))
        location = os.path.join(parent, os.path.basename(joined))
        if not is_inside(self.root, parent) or not is_inside(self.root, location):
            logger.warning("not removing %r: it lies outside the store folder %s", file_path, self.root)
            return
        try:
            os.remove(location)
        except OSError:
            return  # removed by another process, or not ours to remove
        self._prune_empty(parent)

    def _prune_empty(self, folder: str) -> None:
        # diskcache's os.removedirs climbs without bound; stop at the store folder.
        while is_inside(self.root, folder):
            try:
                os.rmdir(folder)
            except OSError:
                return
            folder = os.path.dirname(folder)

    # ------------------------------------------------------------------------------ writes
    def _write_new(self, full_path: str, data: bytes) -> None:
        """Write a fresh file; on any failure (e.g. ENOSPC) remove what was written, then re-raise."""
        for attempt in range(_OPEN_RETRIES):
            try:  # makedirs too: another process may remove the new parent before the leaf is made
                os.makedirs(os.path.dirname(full_path), exist_ok=True)
                fd = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileNotFoundError:
                if attempt == _OPEN_RETRIES - 1:
                    raise
        self._written.paths = [*getattr(self._written, "paths", []), full_path]
        try:
            with os.fdopen(fd, "wb") as handle:
                self._write_all(handle, data)
        except BaseException:
            self.discard_written()
            raise

    def _write_all(self, handle, data: bytes) -> None:
        # One seam for the file write, so a test can inject a fault a real disk cannot be made to give.
        handle.write(data)

    def begin_write(self) -> None:
        """Start tracking the files this thread writes (see `discard_written`)."""
        self._written.paths = []

    def discard_written(self) -> None:
        """Remove the files this thread wrote since `begin_write`: their row was never committed."""
        for path in getattr(self._written, "paths", []):
            try:
                os.remove(path)
            except OSError:
                pass  # gone already, or the disk refuses even this: verify(repair=True) reclaims it
            self._prune_empty(os.path.dirname(path))
        self._written.paths = []
