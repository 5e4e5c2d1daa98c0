"""Opening files in a store folder without following a symbolic link, and only regular files.

Whoever can write a store folder can plant a link (to a shell start-up file, to another user's
data) or a FIFO (which blocks whoever opens it) under any name the store uses. So every file the
store opens goes through `open_file`: `O_NOFOLLOW` (a link is refused, never followed), `O_NONBLOCK`
(a FIFO cannot block the opener) and a check that what was opened is a regular file. Sub-folders are
opened with `O_DIRECTORY | O_NOFOLLOW` and files relative to them (`read_file_in`, and
`disk_files.EntryFiles`), so no step below the store folder can be a link either. The store folder
itself may be a link its user chose: it is resolved once, when the store opens (`resolve_folder`).

A refusal is `UnsafePathError`, an `OSError` (errno `ELOOP` for a link) whose message names the
path and says that the store never follows links, so callers that guard file access already catch it.

Example:
    >>> import os, tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> (folder / "log").symlink_to("/etc/hostname")
    >>> try:
    ...     open_file(folder / "log", os.O_RDONLY)
    ... except UnsafePathError as exc:
    ...     print(exc.errno == errno.ELOOP, "symbolic link, which the store never follows" in exc.strerror)
    True True
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

CLOEXEC = getattr(os, "O_CLOEXEC", 0)
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC
LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR)  # what O_NOFOLLOW answers for a link (ENOTDIR: a link opened as a folder)


class UnsafePathError(OSError):
    """A path inside a store folder that the store refuses to open: a symbolic link, or not a regular file."""

    @classmethod
    def link(cls, path: str | os.PathLike) -> UnsafePathError:
        return cls(errno.ELOOP, f"refusing {os.fspath(path)}: it is a symbolic link, which the store never follows "
                                "(remove it)")  # fmt: skip

    @classmethod
    def not_folder(cls, path: str | os.PathLike) -> UnsafePathError:
        return cls(errno.ENOTDIR, f"refusing {os.fspath(path)}: it is not a folder (remove it)")

    @classmethod
    def not_regular(cls, path: str | os.PathLike, mode: int) -> UnsafePathError:
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
        return cls(errno.EINVAL, f"refusing {os.fspath(path)}: it is {kind}, not a regular file (remove it)")


def resolve_folder(directory: str | os.PathLike) -> Path:
    """The store folder as an absolute path with every link resolved (once, at open: the user's choice)."""
    return Path(os.path.realpath(os.path.expanduser(os.fspath(directory))))


def open_folder(name: str, dir_fd: int, shown: str | os.PathLike) -> int:
    """A descriptor of the sub-folder `name` of `dir_fd`; `UnsafePathError` when it is a link or no folder."""
    try:
        return os.open(name, FOLDER_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in LINK_ERRNOS:
            raise
        try:
            is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            is_link = exc.errno == errno.ELOOP
        raise (UnsafePathError.link(shown) if is_link else UnsafePathError.not_folder(shown)) from None


def open_file(path: str | os.PathLike, flags: int, mode: int = 0o644, *, dir_fd: int | None = None,
              shown: str | os.PathLike | None = None) -> int:  # fmt: skip
    """A descriptor of the regular file `path` (relative to `dir_fd` when given), opened with `flags`
    without following a link; `UnsafePathError` for a link or anything but a regular file.
    `shown`: the path error messages name (default `path`)."""
    shown = path if shown is None else shown
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError.link(shown) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError.not_regular(shown, info.st_mode)
        os.set_blocking(fd, True)  # O_NONBLOCK was for the open only
    except BaseException:
        os.close(fd)
        raise
    return fd


def opener(path: str, flags: int) -> int:
    """`open(..., opener=opener)`: the built-in `open` through `open_file`."""
    return open_file(path, flags)


def read_file_in(directory: str | os.PathLike, name: str) -> bytes:
    """The bytes of `name` (a relative path, `/`-separated) inside `directory`, no step of it
    followed if it is a link; `UnsafePathError` for a link or a file that is not regular."""
    *parts, leaf = name.split("/")
    opened: list[int] = []
    try:
        folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
        opened.append(folder)
        for depth, part in enumerate(parts):
            folder = open_folder(part, folder, Path(directory, *parts[: depth + 1]))
            opened.append(folder)
        fd = open_file(leaf, os.O_RDONLY, dir_fd=folder, shown=Path(directory, name))
        with os.fdopen(fd, "rb") as handle:
            return handle.read()
    finally:
        for fd in opened:
            os.close(fd)


def check_files(directory: Path, names: Iterable[str]) -> None:
    """`UnsafePathError` for the first of `names` in `directory` that exists but is a link or not a
    regular file (for files another library opens by path, such as SQLite's)."""
    for name in names:
        path = directory / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise UnsafePathError.link(path)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError.not_regular(path, info.st_mode)
