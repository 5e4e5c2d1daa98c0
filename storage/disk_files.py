"""`EntryFiles`: the value files of a store folder, named by their key, never reached through a link.

An entry too large to live inside the index is the file `<key[:2]>/<key>.val` under the store
folder. Its path comes from the key alone: nothing read from `cache.db` is ever used as a path.
Every file and sub-folder is opened relative to the store folder with `O_NOFOLLOW`, so a symlink
planted in the folder (for a file or a sub-folder) is refused, never followed, for reading and
writing; removing one removes the link itself. A write goes to a fresh temporary file
(`<key[:2]>/.<key>.<random>.tmp`) that `install` renames into place.

Files of the older layout (`ab/cd/<28 hex>.val`, named by no key) are listed too, for
`rebuild_index` to move to their key's name.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .frame import CorruptEntryError

_HEX2 = re.compile(r"[0-9a-f]{2}\Z")
_ENTRY = re.compile(r"([0-9a-f]{64})\.val\Z")
_TEMP = re.compile(r"\.[0-9a-f]{64}\.[0-9a-f]{16}\.tmp\Z")
_LEGACY = re.compile(r"[0-9a-f]{28}\.val\Z")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_LINKS = (errno.ELOOP, errno.ENOTDIR)  # what O_NOFOLLOW answers for a link (ENOTDIR: a link as a folder)


class UnsafeValueError(CorruptEntryError):
    """A stored value this store refuses to read: a link, not a regular file, or a row value of the wrong type."""


def entry_name(key: str) -> str:
    """Where the file of `key` lives, relative to the store folder."""
    return f"{key[:2]}/{key}.val"


def key_of(name: str) -> str | None:
    """The key a relative name is the entry file of (None: a temporary or older-layout file)."""
    parts = name.split("/")
    found = _ENTRY.match(parts[-1]) if len(parts) == 2 else None
    return found.group(1) if found and parts[0] == found.group(1)[:2] else None


def is_temporary(name: str) -> bool:
    return bool(_TEMP.match(name.rsplit("/", 1)[-1]))


def entry_files(directory: str | os.PathLike) -> list[str]:
    """Relative names of the entry files (of either layout) and temporary files in `directory`."""
    files = EntryFiles(directory)
    try:
        return [name for name, _ in files.listing()]
    finally:
        files.close()


class EntryFiles:
    """The files of one store folder; thread-safe (every call opens what it needs relative to the folder)."""

    def __init__(self, directory: str | os.PathLike):
        self.root: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)

    def close(self) -> None:
        if self.root is not None:
            os.close(self.root)
            self.root = None

    @contextmanager
    def _folder(self, parts: Sequence[str], create: bool = False) -> Iterator[int]:
        """A descriptor of the sub-folder `parts`; `OSError` (ELOOP/ENOTDIR) when a step is a link."""
        opened: list[int] = []
        try:
            folder = self.root
            for part in parts:
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=folder)
                    except FileExistsError:
                        pass
                folder = os.open(part, _FOLDER, dir_fd=folder)
                opened.append(folder)
            yield folder
        finally:
            for fd in opened:
                os.close(fd)

    def read(self, name: str) -> tuple[bytes, float]:
        """`(bytes, mtime)` of the file `name`; `UnsafeValueError` for a link or a non-regular file."""
        *parts, leaf = name.split("/")
        try:
            with self._folder(parts) as folder:  # O_NONBLOCK: a FIFO must not block the reader
                fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=folder)
        except OSError as exc:
            if exc.errno in _LINKS:
                raise UnsafeValueError(f"refusing {name}: it is reached through a symbolic link") from None
            raise
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UnsafeValueError(f"refusing {name}: not a regular file")
            return handle.read(), info.st_mtime

    def write_temporary(self, key: str, data: bytes) -> str:
        """Write `data` to a fresh temporary file beside `key`'s; its name. Nothing is left on failure."""
        name = f"{key[:2]}/.{key}.{secrets.token_hex(8)}.tmp"
        with self._folder([key[:2]], create=True) as folder:
            leaf = name.split("/")[1]
            fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o644, dir_fd=folder)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
            except BaseException:
                _unlink(leaf, folder)
                raise
        return name

    def install(self, temporary: str, key: str) -> None:
        """Rename a temporary file to `key`'s name (replacing a file, or a link, there)."""
        self.move(temporary, entry_name(key))

    def move(self, name: str, target: str) -> None:
        *source_parts, source = name.split("/")
        *target_parts, leaf = target.split("/")
        with self._folder(source_parts) as src, self._folder(target_parts, create=True) as dst:
            os.rename(source, leaf, src_dir_fd=src, dst_dir_fd=dst)

    def remove(self, name: str) -> None:
        """Remove the file (or the link itself) `name`; nothing when absent or reached through a link."""
        *parts, leaf = name.split("/")
        try:
            with self._folder(parts) as folder:
                _unlink(leaf, folder)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, *_LINKS):
                raise

    def listing(self) -> list[tuple[str, float]]:
        """`(relative name, mtime)` of entry files of either layout and temporary files; links
        named like them are listed (to be removed), never followed."""
        found = []
        for sub, is_dir, _ in self._scan([]):
            if not (is_dir and _HEX2.match(sub)):
                continue
            for item, is_dir, mtime in self._scan([sub]):
                name = f"{sub}/{item}"
                if is_dir and _HEX2.match(item):
                    found += [(f"{name}/{old}", old_mtime) for old, old_is_dir, old_mtime in self._scan([sub, item])
                              if _LEGACY.match(old) and not old_is_dir]  # fmt: skip
                elif not is_dir and (key_of(name) is not None or is_temporary(name)):
                    found.append((name, mtime))
        return found

    def _scan(self, parts: list[str]) -> list[tuple[str, bool, float]]:
        """`(name, is a folder (not a link), mtime)` of each item of the sub-folder `parts`."""
        try:
            with self._folder(parts) as folder, os.scandir(folder) as items:
                return [(item.name, item.is_dir(follow_symlinks=False), _mtime(item)) for item in items]
        except OSError as exc:
            if exc.errno in (errno.ENOENT, *_LINKS):
                return []
            raise


def _unlink(leaf: str, folder: int) -> None:
    try:
        os.unlink(leaf, dir_fd=folder)
    except FileNotFoundError:
        pass


def _mtime(item: os.DirEntry) -> float:
    try:
        return item.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:  # removed meanwhile: as young as can be
        return float("inf")
