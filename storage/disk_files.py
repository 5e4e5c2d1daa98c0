"""`EntryFiles`: the value files of a store folder, named by their key, never reached through a link.

An entry too large to live inside the index is the file `<key[:2]>/<key>.val` under the store
folder. Its path comes from the key alone: nothing read from `cache.db` is ever used as a path.
Every file and sub-folder is opened relative to the store folder with `O_NOFOLLOW` (`no_follow.py`),
so a symlink planted in the folder (for a file or a sub-folder) is refused, never followed, for
reading and writing; removing one removes the link itself. `listing` lists planted links named like
the store's files or sub-folders at once (no grace period: the store never makes a link), so
`verify` reports them and its repair removes them. A write goes to a fresh temporary file
(`<key[:2]>/.<key>.<random>.tmp`) that `install` renames into place.

Files of the older layout (`ab/cd/<28 hex>.val`, named by no key) are listed too, for
`rebuild_index` to move to their key's name.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .frame import CorruptEntryError
from .no_follow import CLOEXEC, LINK_ERRNOS, UnsafePathError, open_file, open_folder

_HEX2 = re.compile(r"[0-9a-f]{2}\Z")
_ENTRY = re.compile(r"([0-9a-f]{64})\.val\Z")
_TEMP = re.compile(r"\.[0-9a-f]{64}\.[0-9a-f]{16}\.tmp\Z")
_LEGACY = re.compile(r"[0-9a-f]{28}\.val\Z")
_LINK_AGE = 0.0  # the mtime a planted link is listed with: older than any grace period


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
        self.directory = os.fspath(directory)
        self.root: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)

    def close(self) -> None:
        if self.root is not None:
            os.close(self.root)
            self.root = None

    @contextmanager
    def _folder(self, parts: Sequence[str], create: bool = False) -> Iterator[int]:
        """A descriptor of the sub-folder `parts`; `UnsafePathError` (ELOOP/ENOTDIR) when a step is a
        link or not a folder."""
        opened: list[int] = []
        try:
            folder = self.root
            for depth, part in enumerate(parts):
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=folder)
                    except FileExistsError:
                        pass
                folder = open_folder(part, folder, os.path.join(self.directory, *parts[: depth + 1]))
                opened.append(folder)
            yield folder
        finally:
            for fd in opened:
                os.close(fd)

    def read(self, name: str) -> tuple[bytes, float]:
        """`(bytes, mtime)` of the file `name`; `UnsafeValueError` for a link or a non-regular file."""
        *parts, leaf = name.split("/")
        try:
            with self._folder(parts) as folder:
                fd = open_file(leaf, os.O_RDONLY, dir_fd=folder, shown=os.path.join(self.directory, name))
        except UnsafePathError as exc:
            raise UnsafeValueError(exc.strerror) from None
        with os.fdopen(fd, "rb") as handle:
            return handle.read(), os.fstat(fd).st_mtime

    def write_temporary(self, key: str, data: bytes) -> str:
        """Write `data` to a fresh temporary file beside `key`'s; its name. Nothing is left on failure."""
        name = f"{key[:2]}/.{key}.{secrets.token_hex(8)}.tmp"
        with self._folder([key[:2]], create=True) as folder:
            leaf = name.split("/")[1]
            fd = open_file(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=folder,
                           shown=os.path.join(self.directory, name))  # fmt: skip
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
            if exc.errno not in (errno.ENOENT, *LINK_ERRNOS):
                raise

    def listing(self) -> list[tuple[str, float]]:
        """`(relative name, mtime)` of entry files of either layout and temporary files. Links named
        like them or like the sub-folders are listed too (to be removed, never followed), with the
        mtime 0: the store never makes a link, so no writer can be about to use one."""
        found = []
        for sub, kind, _ in self._scan([]):
            if kind == "link" and _HEX2.match(sub):
                found.append((sub, _LINK_AGE))
            if not (kind == "folder" and _HEX2.match(sub)):
                continue
            for item, kind, mtime in self._scan([sub]):
                name = f"{sub}/{item}"
                if kind == "folder" and _HEX2.match(item):
                    found += [(f"{name}/{old}", _LINK_AGE if old_kind == "link" else old_mtime)
                              for old, old_kind, old_mtime in self._scan([sub, item])
                              if _LEGACY.match(old) and old_kind != "folder"]  # fmt: skip
                elif kind == "link" and _HEX2.match(item):
                    found.append((name, _LINK_AGE))
                elif kind != "folder" and (key_of(name) is not None or is_temporary(name)):
                    found.append((name, _LINK_AGE if kind == "link" else mtime))
        return found

    def _scan(self, parts: list[str]) -> list[tuple[str, str, float]]:
        """`(name, "folder" | "link" | "file", mtime)` of each item of the sub-folder `parts` ("file":
        anything else that is neither a folder nor a link)."""
        try:
            with self._folder(parts) as folder, os.scandir(folder) as items:
                return [(item.name, _kind(item), _mtime(item)) for item in items]
        except OSError as exc:
            if exc.errno in (errno.ENOENT, *LINK_ERRNOS):
                return []
            raise


def _unlink(leaf: str, folder: int) -> None:
    try:
        os.unlink(leaf, dir_fd=folder)
    except FileNotFoundError:
        pass


def _kind(item: os.DirEntry) -> str:
    if item.is_symlink():
        return "link"
    return "folder" if item.is_dir(follow_symlinks=False) else "file"


def _mtime(item: os.DirEntry) -> float:
    try:
        return item.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:  # removed meanwhile: as young as can be
        return float("inf")
