"""Append-only logs of lines that travel with a store: where the chunk catalog lives.

A store with a folder keeps each log as a file there, shared by every process that opens the
store: readers take a shared ``flock``, a writer an exclusive one and reads what others appended
before it appends (so every process sees the same order). A store without a folder keeps its logs
in memory, shared by everything that holds the same store object. Other stores (a remote tier) can
offer the same two operations.

Only bytes move here; what a line means is the reader's business. A torn last line (a writer killed
mid-write) is ended by the next writer before its own lines, so those stay whole. A log file is
opened without following a link and must be a regular file (`no_follow.py`): a planted symlink or
FIFO makes reading or appending raise `UnsafePathError`, an `OSError` (ELOOP for a link) naming it.

    >>> log = MemoryRecordLog("catalog.jsonl")
    >>> with log.appending() as session:
    ...     end = session.append(b'{"a": 1}\\n')
    >>> log.read_from(0), end
    (b'{"a": 1}\\n', 9)
"""

from __future__ import annotations

import fcntl
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Protocol

from .no_follow import opener

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")


def check_log_name(name: str) -> str:
    """A log name is a plain file name inside the store: no separators, no parent folders."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise ValueError(f"a record log name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}")
    return name


class AppendSession(Protocol):
    def read_from(self, offset: int) -> bytes: ...

    def append(self, data: bytes) -> int:
        """Append ``data`` (whole lines); returns the log's length after it."""
        ...


class RecordLog(Protocol):
    name: str
    path: Path | None  # the file, for a store with a folder

    def read_from(self, offset: int) -> bytes:
        """Everything appended from byte ``offset`` on (``b""`` when nothing); a consistent snapshot."""
        ...

    def appending(self): ...  # context manager -> AppendSession, exclusive until it exits


class FileRecordLog:
    def __init__(self, folder: Path, name: str):
        self.name = check_log_name(name)
        self.path = Path(folder) / name

    def read_from(self, offset: int) -> bytes:
        try:
            handle = open(self.path, "rb", opener=opener)
        except FileNotFoundError:
            return b""
        with handle:
            fcntl.flock(handle, fcntl.LOCK_SH)  # released on close
            handle.seek(offset)
            return handle.read()

    @contextmanager
    def appending(self) -> Iterator["_FileSession"]:
        """Raises ``OSError`` when the folder cannot be written (read-only mount, full disk)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # unbuffered: a failed write raises at once, not again from close()
        with open(self.path, "a+b", buffering=0, opener=opener) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released on close
            yield _FileSession(handle)


class _FileSession:
    def __init__(self, handle: BinaryIO):
        self._handle = handle

    def read_from(self, offset: int) -> bytes:
        self._handle.seek(offset)
        return self._handle.read()

    def append(self, data: bytes) -> int:
        handle = self._handle
        end = handle.seek(0, 2)
        if end and not self.read_from(end - 1).endswith(b"\n"):
            data = b"\n" + data  # end a torn line first
        written = 0
        handle.seek(0, 2)
        while written < len(data):  # a raw write may take only part of the bytes
            written += handle.write(data[written:])
        return end + len(data)


class MemoryRecordLog:
    """A log kept by one store object in this process."""

    path = None

    def __init__(self, name: str):
        self.name = check_log_name(name)
        self._data = bytearray()
        self._lock = threading.RLock()

    def read_from(self, offset: int) -> bytes:
        with self._lock:
            return bytes(self._data[offset:])

    @contextmanager
    def appending(self) -> Iterator["MemoryRecordLog"]:
        with self._lock:
            yield self

    def append(self, data: bytes) -> int:
        with self._lock:
            if self._data and not self._data.endswith(b"\n"):
                self._data += b"\n"
            self._data += data
            return len(self._data)
