"""Checking a disk tier (`verify_disk`, `clear_disk`) and recovering a store whose index (`cache.db`)
is damaged, missing or of an older format (`rebuild_index`, `clear_damaged`).

`verify_disk` checks every entry, lists rows not in the store's form and files no row names, and
removes corrupt entries always, the other problems with `repair` (see `VerifyReport`). A file no
row names counts only once older than `ORPHAN_GRACE_S`: a live writer writes its file a moment
before its row, and gives up after its lock timeout.

The damaged index is never deleted: it is renamed `cache.db.damaged-<time>` (with its `-wal`,
`-shm` and `-journal` files, which SQLite would otherwise replay into a fresh index; a link in
place of any of them is moved aside as the link, never followed). `rebuild_index` then indexes
again every entry file that decodes and verifies with the codec its frame names (looked up in
`codec_registry.CODECS`) under the key its name says: an entry's bytes carry their key. Files of
the older layout (`ab/cd/<28 hex>.val`, an index of diskcache's format) move to their key's name,
the newest when a key has several. Entries small enough to live inside the index itself (below
`StoreOptions.disk_min_file_bytes`) are lost with it; the report counts them when the damaged
file can still be read. `clear_damaged` starts empty instead. Both expect no other process to use
the store meanwhile (with a damaged index none can).

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
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .byte_tier import Classify, verify_values
from .codec_registry import CODECS
from .disk_files import EntryFiles, entry_name, is_temporary, key_of
from .disk_index import INDEX_SUFFIXES, OURS, connect, create_index, transaction
from .errors import DB_NAME, WRITE_FAILURES, StoreWriteError, unwritable_reason
from .frame import CorruptEntryError, unpack_frame
from .stats import VerifyReport

if TYPE_CHECKING:
    from .disk import DiskBytes

logger = logging.getLogger(__name__)
ORPHAN_GRACE_S = 300.0
# Entries whose bytes lived inside an index: of this format, and of diskcache's.
_IN_INDEX = ("SELECT count(*) FROM entries WHERE value IS NOT NULL", "SELECT count(*) FROM Cache WHERE filename IS NULL")


def _refuse_read_only(tier: DiskBytes, what: str) -> None:
    if tier.read_only:
        raise StoreWriteError(tier.directory, None, OSError(errno.EROFS, f"the store is read-only; cannot {what} it"))


def verify_disk(tier: DiskBytes, classify: Classify, repair: bool = False) -> VerifyReport:
    """Check every entry of `tier` with `classify`, its rows and its files; what `repair` removes is listed."""
    if repair:
        _refuse_read_only(tier, "repair")
    try:
        report = verify_values(tier, classify, repair, read=tier.value)
        report.foreign_rows = [rowid for (rowid,) in tier.index.rows(f"SELECT rowid FROM entries WHERE NOT {OURS}")]
        with tier.index.transaction() if repair else nullcontext():  # no writer adds a file meanwhile
            if repair:
                tier.index.rows(f"DELETE FROM entries WHERE NOT {OURS}")  # names no file: keys name files
            named = {key for (key,) in tier.index.rows(f"SELECT key FROM entries WHERE {OURS} AND value IS NULL")}
            for name, mtime in tier.files.listing():
                if key_of(name) not in named and time.time() - mtime >= ORPHAN_GRACE_S:
                    report.orphan_files.append(name)
                    if repair:
                        tier.files.remove(name)
    except WRITE_FAILURES as exc:
        raise StoreWriteError(tier.directory, None, exc) from exc
    if report.foreign_rows or report.orphan_files:
        logger.warning("verify: %d rows of %s are not in this store's form and %d files belong to no entry%s",
                       len(report.foreign_rows), tier.directory, len(report.orphan_files),
                       "; removed" if repair else "")  # fmt: skip
    return report


def clear_disk(tier: DiskBytes) -> None:
    """Delete every row of `tier` and every entry file (a temporary one only past the grace period)."""
    _refuse_read_only(tier, "clear")
    try:
        with tier.index.transaction():
            tier.index.rows("DELETE FROM entries")
            for name, mtime in tier.files.listing():
                if not is_temporary(name) or time.time() - mtime >= ORPHAN_GRACE_S:
                    tier.files.remove(name)
    except WRITE_FAILURES as exc:
        raise StoreWriteError(tier.directory, None, exc) from exc


@dataclass
class RebuildReport:
    """What a recovery did: where the damaged index went, which entries came back, which were lost.

    `recovered`: keys indexed again. `unreadable`: entry files that did not decode (damaged, of
    another format version, of a codec not registered here, without a key, or not the entry their
    name says), removed. `duplicates`: older-layout files of a key already found, removed.
    `cleared`: entry files removed by `clear_damaged`. `lost_in_index`: entries whose bytes lived
    inside the damaged index (None when it could not be read to count them).
    """

    directory: Path
    quarantined: Path | None
    recovered: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    lost_in_index: int | None = None


def quarantine_index(directory: str | Path) -> Path | None:
    """Rename `cache.db` (and its `-wal`/`-shm`/`-journal`, also without it) to `cache.db.damaged-<time>`;
    the new path of `cache.db`, or None when there was none."""
    directory = Path(directory)
    db = directory / DB_NAME
    sides = {suffix: directory / f"{DB_NAME}{suffix}" for suffix in INDEX_SUFFIXES[1:]}
    if not any(os.path.lexists(path) for path in (db, *sides.values())):
        return None
    target = directory / f"{DB_NAME}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        if not any(os.path.lexists(f"{target}{suffix}") for suffix in ("", *sides)):
            break
        target = target.with_name(f"{DB_NAME}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
    moved = os.path.lexists(db)
    if moved:
        os.rename(db, target)
    for suffix, side in sides.items():
        if os.path.lexists(side):
            os.rename(side, f"{target}{suffix}")
    logger.warning("moved the damaged index of %s to %s", directory, target.name)
    return target if moved else None


def _start(directory: Path) -> tuple[RebuildReport, EntryFiles]:
    reason = unwritable_reason(directory)
    if reason is not None:
        raise StoreWriteError(directory, None, OSError(errno.EROFS, f"cannot recover the store: {reason}"))
    report = RebuildReport(directory, quarantine_index(directory))
    report.lost_in_index = _count_in_index(report.quarantined)
    return report, EntryFiles(directory)


def rebuild_index(directory: str | Path, *, timeout_s: float = 60.0) -> RebuildReport:
    """Quarantine the index and build a new one from the entry files that decode and verify."""
    report, files = _start(Path(directory))
    try:
        rows = _recover_files(files, report)
    finally:
        files.close()
    con = connect(report.directory / DB_NAME, timeout_s)
    try:
        create_index(con)
        with transaction(con):
            con.executemany("INSERT OR REPLACE INTO entries (key, size, heat, value) VALUES (?, ?, ?, NULL)", rows)
    finally:
        con.close()
    logger.warning("rebuilt the index of %s: %d entries recovered, %d unreadable files removed",
                   report.directory, len(report.recovered), len(report.unreadable))  # fmt: skip
    return report


def _recover_files(files: EntryFiles, report: RebuildReport) -> list[tuple[str, int, float]]:
    """`(key, size, mtime)` of each key's file; the rest removed and reported."""
    found = []
    for name, _ in files.listing():
        if is_temporary(name):
            files.remove(name)
            continue
        try:
            data, mtime = files.read(name)
            key = _key_in(data)
        except (OSError, CorruptEntryError):
            key = None
        if key is None or key_of(name) not in (None, key):  # a file under another key's name is not trusted
            report.unreadable.append(name)
            files.remove(name)
        else:
            found.append((key_of(name) is None, -mtime, key, name, len(data)))
    rows, seen = [], set()
    for older_layout, newest_first, key, name, size in sorted(found):  # a file under its key's name wins
        if key in seen:
            report.duplicates.append(name)
            files.remove(name)
            continue
        seen.add(key)
        if older_layout:
            files.move(name, entry_name(key))
        report.recovered.append(key)
        rows.append((key, size, -newest_first))
    return rows


def _key_in(data: bytes) -> str | None:
    """The key written in a file's bytes once its frame and payload verify with the codec it names."""
    try:
        codec = CODECS.get(unpack_frame(data).codec_id)
    except ValueError as exc:  # a codec not registered in this process
        raise CorruptEntryError(str(exc)) from None
    return codec.decode_keyed(data)[0]


def _count_in_index(quarantined: Path | None) -> int | None:
    """Entries whose bytes lived inside the damaged index, if it can still be read that far."""
    if quarantined is None or quarantined.is_symlink():
        return None
    for statement in _IN_INDEX:
        try:
            con = sqlite3.connect(f"{quarantined.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
            try:
                return con.execute(statement).fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error:
            continue
    return None


def clear_damaged(directory: str | Path) -> RebuildReport:
    """Quarantine the index and remove every entry file: the store starts empty when next opened."""
    report, files = _start(Path(directory))
    try:
        for name, _ in files.listing():
            files.remove(name)
            report.cleared.append(name)
    finally:
        files.close()
    return report
