"""Recovering a store whose index (`cache.db`) is damaged or missing.

The damaged index is never deleted: it is renamed `cache.db.damaged-<time>` (with its `-wal` and
`-shm` files, which SQLite would otherwise replay into a fresh index). `rebuild_index` then indexes
again every entry file that decodes and verifies with the codec its frame names (looked up in
`codec_registry.CODECS`): since format version 2 an entry's bytes carry its key, so a file alone
says which key it belongs to. Entries small enough to live inside the index
itself (below `StoreOptions.disk_min_file_bytes`) are lost with it; the report counts them when the
damaged file can still be read. `clear_damaged` starts empty instead. Both expect no other process
to use the store meanwhile (with a damaged index none can).

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from fusionrag_llm.storage import DiskTier, KVEntry
    >>> folder = Path(tempfile.mkdtemp())
    >>> tier = DiskTier(folder, 2**24, min_file_bytes=0)  # every entry a file
    >>> tier.put("ab" * 32, KVEntry((1,), torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4)))
    True
    >>> tier.close()
    >>> _ = (folder / "cache.db").write_bytes(b"garbage")
    >>> report = rebuild_index(folder)
    >>> report.recovered == ["ab" * 32], report.quarantined.name.startswith("cache.db.damaged-")
    (True, True)
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from .codec_registry import CODECS
from .disk_index import OURS, DiskIndex, unwritable_reason
from .errors import DB_NAME, StoreWriteError
from .frame import CorruptEntryError, unpack_frame
from .safe_disk import SafeDisk, entry_files

logger = logging.getLogger(__name__)


@dataclass
class RebuildReport:
    """What a recovery did: where the damaged index went, which entries came back, which were lost.

    `recovered`: keys indexed again. `unreadable`: entry files that did not decode (damaged, of
    another format version, of a codec not registered here, or without a key), removed. `duplicates`: older files of a key found twice,
    removed. `cleared`: entry files removed by `clear_damaged`. `lost_in_index`: entries whose bytes
    lived inside the damaged index (None when it could not be read to count them).
    """

    directory: Path
    quarantined: Path | None
    recovered: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    lost_in_index: int | None = None


def quarantine_index(directory: str | Path) -> Path | None:
    """Rename `cache.db` (and its `-wal`/`-shm`) to `cache.db.damaged-<time>`; the new path, or None."""
    directory = Path(directory)
    db = directory / DB_NAME
    if not db.exists():
        return None
    target = directory / f"{DB_NAME}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        if not target.exists():
            break
        target = target.with_name(f"{DB_NAME}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
    os.rename(db, target)
    for suffix in ("-wal", "-shm"):
        side = directory / f"{DB_NAME}{suffix}"
        if side.exists():
            os.rename(side, f"{target}{suffix}")
    logger.warning("moved the damaged index of %s to %s", directory, target.name)
    return target


def _check_writable(directory: Path) -> None:
    reason = unwritable_reason(directory)
    if reason is not None:
        raise StoreWriteError(directory, None, OSError(errno.EROFS, f"cannot recover the store: {reason}"))


def rebuild_index(directory: str | Path, *, min_file_bytes: int = 32 * 1024, timeout_s: float = 60.0) -> RebuildReport:
    """Quarantine the index and build a new one from the entry files that decode and verify."""
    directory = Path(directory)
    _check_writable(directory)
    report = RebuildReport(directory, quarantine_index(directory))
    index = DiskIndex(directory, read_only=False, min_file_bytes=min_file_bytes, timeout_s=timeout_s)
    try:
        index.insert_file_rows(_recover_files(index.disk, report))
    finally:
        index.close()
    report.lost_in_index = _count_in_index(report.quarantined)
    logger.warning("rebuilt the index of %s: %d entries recovered, %d unreadable files removed",
                   directory, len(report.recovered), len(report.unreadable))  # fmt: skip
    return report


def _recover_files(disk: SafeDisk, report: RebuildReport) -> list[tuple[str, str, int, float]]:
    """`(key, filename, size, mtime)` of each key's newest valid file; the rest removed and reported."""
    found = []
    for name in entry_files(report.directory):
        try:
            with disk.open_entry_file(name) as handle:
                mtime, data = os.fstat(handle.fileno()).st_mtime, handle.read()
            key = _key_of(data)
        except (OSError, CorruptEntryError):
            key = None
        if key is None:
            report.unreadable.append(name)
            disk.remove(name)
        else:
            found.append((mtime, key, name, len(data)))
    rows, seen = [], set()
    for mtime, key, name, size in sorted(found, reverse=True):  # newest first: a rewrite wins
        if key in seen:
            report.duplicates.append(name)
            disk.remove(name)
            continue
        seen.add(key)
        report.recovered.append(key)
        rows.append((key, name, size, mtime))
    return rows


def _key_of(data: bytes) -> str | None:
    """The key written in a file's bytes once its frame and payload verify with the codec it names."""
    try:
        codec = CODECS.get(unpack_frame(data).codec_id)
    except ValueError as exc:  # a codec not registered in this process
        raise CorruptEntryError(str(exc)) from None
    return codec.decode_keyed(data)[0]


def _count_in_index(quarantined: Path | None) -> int | None:
    """Entries whose bytes lived inside the damaged index, if it can still be read that far."""
    if quarantined is None:
        return None
    try:
        con = sqlite3.connect(f"{quarantined.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            return con.execute(f"SELECT count(*) FROM Cache WHERE {OURS} AND filename IS NULL").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return None


def clear_damaged(directory: str | Path) -> RebuildReport:
    """Quarantine the index and remove every entry file: the store starts empty when next opened."""
    directory = Path(directory)
    _check_writable(directory)
    report = RebuildReport(directory, quarantine_index(directory))
    disk = SafeDisk(str(directory))
    for name in list(entry_files(directory)):
        disk.remove(name)
        report.cleared.append(name)
    report.lost_in_index = _count_in_index(report.quarantined)
    return report
